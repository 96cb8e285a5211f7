/**
 * Coming back after a cull: when JupyterLab starts, the checkpoint the governor took before it
 * stopped the previous server is announced ("Stopped at 14:02 because its GPU was idle;
 * checkpoint saved.") with its notebooks, the one-line restore and, when something went wrong,
 * the manifest. Which checkpoint and what it says are decided in model/comeback.ts; this is the
 * wiring.
 */
import { Clipboard, Dialog, Notification } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { GpuGovApi } from '../api';
import {
  comingBackCheckpoint,
  comingBackView,
  dismissedIds,
  manifestDetails,
  rememberDismissed
} from '../model/comeback';
import { readStored, safeLocalStorage, writeStored } from '../storage';
import { ITrans } from '../trans';

export interface IComingBackOptions {
  api: GpuGovApi;
  trans: ITrans;
  openPath: (path: string) => void;
  /** Where the dismissed checkpoint ids are kept (per server URL). */
  storageKey: string;
  storage?: Storage | null;
}

/** Announce the governor's last checkpoint, if there is one to announce; its notification id. */
export async function announceComingBack(
  options: IComingBackOptions
): Promise<string | null> {
  const { api, trans, storageKey } = options;
  const storage =
    options.storage === undefined ? safeLocalStorage() : options.storage;
  const [listed, started] = await Promise.all([
    api.checkpoints(),
    api.serverStarted()
  ]);
  if (listed.status !== 200 || !listed.body) {
    return null; // an older server extension, or none: nothing to say
  }
  const summary = comingBackCheckpoint(listed.body.checkpoints, {
    started,
    now: Date.now(),
    dismissed: dismissedIds(readStored(storage, storageKey))
  });
  if (!summary) {
    return null;
  }
  const view = comingBackView(summary, { now: Date.now(), trans });
  const keepOpen = (run: () => void) => (event: MouseEvent) => {
    event.preventDefault();
    run();
  };
  const details = () => void showDetails(view.id, options);
  const actions: Notification.IAction[] = view.notebooks.map(link => ({
    label: link.label,
    caption: link.path,
    displayType: 'accent',
    callback: keepOpen(() => options.openPath(link.path))
  }));
  if (view.moreLabel) {
    actions.push({
      label: view.moreLabel,
      caption: trans.__('List every notebook this checkpoint saved'),
      displayType: 'link',
      callback: keepOpen(details)
    });
  }
  actions.push({
    label: trans.__('Copy restore code'),
    caption: view.restore,
    callback: keepOpen(() => {
      Clipboard.copyToSystem(view.restore); // synchronous: inside the click
      Notification.success(
        trans.__('Copied: %1 — paste it into a notebook cell.', view.restore),
        { autoClose: 8000 }
      );
    })
  });
  if (view.details) {
    actions.push({
      label: trans.__('Details'),
      caption: trans.__('What went wrong, and the whole manifest'),
      callback: keepOpen(details)
    });
  }
  actions.push({
    label: trans.__('Dismiss'),
    caption: trans.__('Do not show this checkpoint again'),
    callback: () =>
      writeStored(
        storage,
        storageKey,
        rememberDismissed(
          dismissedIds(readStored(storage, storageKey)),
          view.id
        )
      )
  });
  return Notification.emit(view.message, view.kind, {
    autoClose: false,
    actions
  });
}

/** The checkpoint's manifest in a dialog: problems first, the notebooks, then the JSON. */
async function showDetails(
  id: string,
  options: IComingBackOptions
): Promise<void> {
  const { api, trans } = options;
  const response = await api.checkpointManifest(id);
  if (response.status !== 200 || !response.body) {
    Notification.error(
      trans.__(
        'Could not read checkpoint %1: %2',
        id,
        response.message ?? `HTTP ${response.status}`
      ),
      { autoClose: 8000 }
    );
    return;
  }
  const details = manifestDetails(id, response.body, trans);
  const body = new Widget();
  body.addClass('jp-GpuGov-checkpoint');
  const dialog = new Dialog({
    title: details.title,
    body,
    buttons: [Dialog.okButton({ label: trans.__('Close') })]
  });
  const node = body.node;
  if (details.path) {
    const where = document.createElement('p');
    where.textContent = trans.__('Saved in %1', details.path);
    node.appendChild(where);
  }
  if (details.problems.length) {
    node.appendChild(heading(trans.__('Problems')));
    const list = document.createElement('ul');
    list.className = 'jp-GpuGov-checkpoint-problems';
    for (const problem of details.problems) {
      const item = document.createElement('li');
      item.textContent = problem;
      list.appendChild(item);
    }
    node.appendChild(list);
  }
  if (details.notebooks.length) {
    node.appendChild(heading(trans.__('Notebooks')));
    const list = document.createElement('ul');
    for (const path of details.notebooks) {
      const item = document.createElement('li');
      const link = document.createElement('button');
      link.className = 'jp-GpuGov-button jp-GpuGov-link';
      link.textContent = path;
      link.title = trans.__('Open %1', path);
      link.addEventListener('click', () => {
        dialog.resolve();
        options.openPath(path);
      });
      item.appendChild(link);
      list.appendChild(item);
    }
    node.appendChild(list);
  }
  node.appendChild(heading(trans.__('Manifest')));
  const json = document.createElement('pre');
  json.className = 'jp-GpuGov-manifest';
  json.textContent = details.json;
  node.appendChild(json);
  await dialog.launch();
}

function heading(text: string): HTMLElement {
  const h = document.createElement('h3');
  h.textContent = text;
  return h;
}
