/**
 * What the extension keeps in the browser's localStorage (warnings raised, checkpoints
 * dismissed, starts announced), read and written so that a full or disabled storage only
 * means a notice may show again.
 */

/** localStorage, or null where the browser refuses it. */
export function safeLocalStorage(): Storage | null {
  try {
    return window.localStorage;
  } catch {
    return null;
  }
}

export function readStored(
  storage: Storage | null,
  key: string
): string | null {
  try {
    return storage?.getItem(key) ?? null;
  } catch {
    return null;
  }
}

/** Keep a list of ids (JSON); a refusal is ignored: it will be announced again next time. */
export function writeStored(
  storage: Storage | null,
  key: string,
  ids: string[]
): void {
  try {
    storage?.setItem(key, JSON.stringify(ids));
  } catch {
    // Storage full or disabled.
  }
}
