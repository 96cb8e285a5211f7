import { DEFAULT_SETTINGS, readSettings } from '../src/settings';

import schema from '../schema/plugin.json';

describe('settings', () => {
  it('has the schema’s defaults', () => {
    const defaults: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(schema.properties)) {
      defaults[key] = value.default;
    }
    expect(defaults).toEqual(DEFAULT_SETTINGS);
    expect(readSettings(null)).toEqual(DEFAULT_SETTINGS);
  });

  it('takes good values and falls back on bad ones', () => {
    expect(
      readSettings({
        pollInterval: 30,
        showStatusItem: false,
        notificationStyle: 'panel'
      })
    ).toEqual({
      pollInterval: 30,
      showStatusItem: false,
      notificationStyle: 'panel'
    });
    expect(
      readSettings({
        pollInterval: 0,
        showStatusItem: 'no',
        notificationStyle: 'loud'
      })
    ).toEqual(DEFAULT_SETTINGS);
  });
});
