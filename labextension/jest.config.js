/**
 * jest for the view-models (src/model/, src/format.ts: pure, in node) and the React views of
 * the panel and the stopped tab (src/ui/components.tsx, rendered in jsdom by the specs that ask
 * for it). Neither imports JupyterLab's ES modules, so plain ts-jest is enough.
 */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testRegex: '.*\\.spec\\.tsx?$',
  transform: {
    '^.+\\.tsx?$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  },
  collectCoverageFrom: [
    'src/format.ts',
    'src/model/*.ts',
    'src/poller.ts',
    'src/settings.ts',
    'src/ui/components.tsx'
  ],
  coverageReporters: ['text-summary'],
  reporters: ['default']
};
