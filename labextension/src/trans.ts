/**
 * The subset of JupyterLab's TranslationBundle the views use (`%1`, `%2` placeholders), and an
 * identity bundle for tests and for when no ITranslator is available.
 */

export interface ITrans {
  __(msgid: string, ...args: unknown[]): string;
  /** Plural forms: `n` picks the form and is also `%1`. */
  _n(msgid: string, msgidPlural: string, n: number, ...args: unknown[]): string;
}

function substitute(msgid: string, args: unknown[]): string {
  return msgid.replace(/%(\d+)/g, (match, n) => {
    const i = Number(n) - 1;
    return i < args.length ? String(args[i]) : match;
  });
}

/** Identity translation with JupyterLab's `%N` substitution. */
export const nullTrans: ITrans = {
  __: (msgid: string, ...args: unknown[]) => substitute(msgid, args),
  _n: (msgid: string, plural: string, n: number, ...args: unknown[]) =>
    substitute(n === 1 ? msgid : plural, [n, ...args])
};
