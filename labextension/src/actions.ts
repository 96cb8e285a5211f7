/**
 * What the buttons and commands do: Extend (with the reason prompt), Checkpoint (open documents
 * saved first) and Stop server (after a confirmation). One at a time; each ends with a
 * notification that says what happened.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';

import { GpuGovApi } from './api';
import {
  checkpointOutcome,
  extendOutcome,
  IOutcome,
  stopOutcome
} from './model/outcomes';
import { checkReason, reasonMode } from './model/warning';
import { StatusPoller } from './poller';
import { ITrans } from './trans';
import { IWarningActions } from './ui/warning';

export function notify(outcome: IOutcome): void {
  Notification.emit(outcome.message, outcome.kind, {
    autoClose: outcome.kind === 'success' ? 6000 : false
  });
}

/** Save every open, dirty, writable document; how many saved and which failed. */
async function saveDirtyDocuments(
  app: JupyterFrontEnd,
  docManager: IDocumentManager | null
): Promise<{ saved: number; failed: string[] }> {
  const result = { saved: 0, failed: [] as string[] };
  if (!docManager) {
    return result;
  }
  type Context = NonNullable<ReturnType<IDocumentManager['contextForWidget']>>;
  const contexts = new Set<Context>();
  for (const widget of app.shell.widgets('main')) {
    const context = docManager.contextForWidget(widget);
    if (context) {
      contexts.add(context);
    }
  }
  for (const context of contexts) {
    if (!context.model.dirty || context.model.readOnly || !context.isReady) {
      continue;
    }
    try {
      await context.save();
      result.saved += 1;
    } catch (error) {
      result.failed.push(context.path);
      console.warn(`jupyter-gpu-gov: could not save ${context.path}`, error);
    }
  }
  return result;
}

export interface IGpuGovActions extends IWarningActions {
  /** Save, then checkpoint: the governor asked for it before a cull. */
  checkpointForGovernor(): Promise<void>;
}

export function createActions(options: {
  app: JupyterFrontEnd;
  api: GpuGovApi;
  poller: StatusPoller;
  trans: ITrans;
  docManager: IDocumentManager | null;
}): IGpuGovActions {
  const { app, api, poller, trans, docManager } = options;

  let busy = false;
  const exclusive = async (run: () => Promise<void>) => {
    if (busy || poller.stopped) {
      return;
    }
    busy = true;
    try {
      await run();
    } finally {
      busy = false;
    }
  };

  const checkpoint = async (reason: string) => {
    const saved = await saveDirtyDocuments(app, docManager);
    const response = await api.checkpoint(reason);
    const ok = response.status === 200 && response.body;
    if (ok) {
      poller.noteCheckpoint(response.body);
    }
    notify(
      checkpointOutcome(
        ok ? response.body : null,
        saved,
        ok ? null : (response.message ?? `HTTP ${response.status}`),
        trans
      )
    );
    void poller.refresh();
  };

  const extend = async () => {
    const mode = reasonMode(poller.report?.verdict);
    let error: string | null = null;
    for (;;) {
      const result = await InputDialog.getText({
        title: trans.__('Extend GPU time'),
        label:
          (error ? error + '\n' : '') +
          (mode === 'required'
            ? trans.__('Why do you need the GPU longer? (required)')
            : trans.__('Why do you need the GPU longer? (optional)')),
        placeholder: trans.__(
          'e.g. waiting for data, training resumes at 14:00'
        ),
        okLabel: trans.__('Extend'),
        cancelLabel: trans.__('Cancel')
      });
      if (!result.button.accept || poller.stopped) {
        return;
      }
      const check = checkReason(mode, result.value, trans);
      if (check.ok) {
        const response = await api.extend(check.reason);
        notify(
          extendOutcome(
            response.status,
            response.body ?? { message: response.message ?? undefined },
            { now: Date.now(), trans },
            response.retryAfter ?? null
          )
        );
        void poller.refresh();
        return;
      }
      error = check.error;
    }
  };

  const stop = async () => {
    const answer = await showDialog({
      title: trans.__('Stop this server now?'),
      body: trans.__(
        'Open documents are saved first. Running kernels end and their memory is lost; the GPU goes back to the pool.'
      ),
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({ label: trans.__('Stop server') })
      ]
    });
    if (!answer.button.accept || poller.stopped) {
      return;
    }
    await saveDirtyDocuments(app, docManager);
    const response = await api.stop('stopped by the owner from JupyterLab');
    const outcome = stopOutcome(
      response.status,
      response.body,
      trans,
      response.retryAfter ?? null
    );
    if (outcome.kind === 'success') {
      poller.markStopped(true); // the tab says so at once; the Hub follows
    } else {
      notify(outcome);
    }
  };

  return {
    extend: () => exclusive(extend),
    checkpoint: () =>
      exclusive(() => checkpoint('requested by the owner from JupyterLab')),
    stop: () => exclusive(stop),
    // Not queued behind an open Extend prompt: the governor waits only a few seconds.
    checkpointForGovernor: async () => {
      if (!poller.stopped) {
        await checkpoint('requested by the GPU governor');
      }
    }
  };
}
