/**
 * jest for the pure view logic (src/model.ts). The model imports nothing from JupyterLab, so
 * plain ts-jest in node is enough (no jsdom, no @jupyterlab/testutils).
 */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testRegex: '.*\\.spec\\.ts$',
  transform: {
    '^.+\\.tsx?$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  },
  collectCoverageFrom: ['src/model.ts'],
  coverageReporters: ['text-summary'],
  reporters: ['default']
};
