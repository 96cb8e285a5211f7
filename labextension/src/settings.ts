/**
 * The user's settings (schema/plugin.json), with their defaults when the setting registry is
 * unavailable or a value is out of range.
 */

export type NotificationStyle = 'toast' | 'panel' | 'status-bar';

export interface IGpuGovSettings {
  /** Seconds between two status polls. */
  pollInterval: number;
  showStatusItem: boolean;
  notificationStyle: NotificationStyle;
}

export const DEFAULT_SETTINGS: IGpuGovSettings = {
  pollInterval: 5,
  showStatusItem: true,
  notificationStyle: 'toast'
};

const STYLES: readonly string[] = ['toast', 'panel', 'status-bar'];

/** The settings from the registry's composite values, each checked. */
export function readSettings(
  composite: Record<string, unknown> | null | undefined
): IGpuGovSettings {
  const values = composite ?? {};
  const interval = Number(values.pollInterval);
  const style = values.notificationStyle;
  return {
    pollInterval:
      Number.isFinite(interval) && interval >= 1 && interval <= 600
        ? interval
        : DEFAULT_SETTINGS.pollInterval,
    showStatusItem:
      typeof values.showStatusItem === 'boolean'
        ? values.showStatusItem
        : DEFAULT_SETTINGS.showStatusItem,
    notificationStyle:
      typeof style === 'string' && STYLES.includes(style)
        ? (style as NotificationStyle)
        : DEFAULT_SETTINGS.notificationStyle
  };
}
