/**
 * jupyter-gpu-gov: this server's GPU in the status bar, a GPU panel, idle warnings with
 * Extend / Checkpoint now / Stop server now, saving dirty documents before a checkpoint, and,
 * after the governor stopped the previous server, what was saved and how to get it back.
 * Talks only to its own server extension (`/jupyter-gpu-gov/...`).
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';

import { GpuGovApi } from './api';
import { announceComingBack } from './comeback';
import {
  approvalOutcome,
  checkpointDue,
  checkpointOutcome,
  checkReason,
  extendOutcome,
  IOutcome,
  IVerdict,
  reasonMode,
  stopOutcome
} from './model';
import { GpuPanel } from './panel';
import { StatusPoller } from './poller';
import { GpuStatusItem } from './statusbar';
import { IWarningActions, WarningNotifier } from './warning';

const PLUGIN_ID = 'jupyter-gpu-gov:plugin';

const CommandIDs = {
  open: 'jupyter-gpu-gov:open-panel',
  extend: 'jupyter-gpu-gov:extend',
  checkpoint: 'jupyter-gpu-gov:checkpoint',
  stop: 'jupyter-gpu-gov:stop-server'
};

function notify(outcome: IOutcome): void {
  Notification.emit(outcome.message, outcome.kind, {
    autoClose: outcome.kind === 'success' ? 6000 : false
  });
}

/** Save every open, dirty, writable document; returns how many saved and which failed. */
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

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'GPU status, idle warnings and Extend buttons for jupyter-gpu-gov.',
  autoStart: true,
  optional: [IStatusBar, ILabShell, ITranslator, IDocumentManager],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    translator: ITranslator | null,
    docManager: IDocumentManager | null
  ) => {
    const trans = (translator ?? nullTranslator).load('jupyter_gpu_gov');
    const settings = app.serviceManager.serverSettings;
    const api = new GpuGovApi(settings);
    const poller = new StatusPoller({
      api,
      events: app.serviceManager.events ?? null
    });

    let busy = false;
    const exclusive = async (run: () => Promise<void>) => {
      if (busy) {
        return;
      }
      busy = true;
      try {
        await run();
      } finally {
        busy = false;
      }
    };

    const runCheckpoint = async (reason: string) => {
      const saved = await saveDirtyDocuments(app, docManager);
      const response = await api.checkpoint(reason);
      const ok = response.status === 200 && response.body;
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

    const actions: IWarningActions = {
      extend: () =>
        exclusive(async () => {
          const verdict = poller.report?.verdict ?? null;
          const mode = reasonMode(verdict);
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
            if (!result.button.accept) {
              return;
            }
            const check = checkReason(mode, result.value, trans);
            if (check.ok) {
              const response = await api.extend(check.reason);
              notify(
                extendOutcome(
                  response.status,
                  response.body ?? { message: response.message ?? undefined },
                  { now: Date.now(), trans }
                )
              );
              void poller.refresh();
              return;
            }
            error = check.error;
          }
        }),
      checkpoint: () =>
        exclusive(() =>
          runCheckpoint('requested by the owner from JupyterLab')
        ),
      stop: () =>
        exclusive(async () => {
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
          if (!answer.button.accept) {
            return;
          }
          await saveDirtyDocuments(app, docManager);
          const response = await api.stop(
            'stopped by the owner from JupyterLab'
          );
          notify(stopOutcome(response.status, response.body, trans));
        })
    };

    const openPath = (path: string) => {
      if (docManager) {
        docManager.openOrReveal(path);
      } else {
        void app.commands.execute('docmanager:open', { path });
      }
    };
    const panel = new GpuPanel({ poller, trans, actions, openPath });
    if (labShell) {
      labShell.add(panel, 'right', { rank: 900 });
    } else {
      app.shell.add(panel, 'right', { rank: 900 });
    }
    const openPanel = () => app.shell.activateById(panel.id);

    app.commands.addCommand(CommandIDs.open, {
      label: trans.__('Show GPU Panel'),
      execute: openPanel
    });
    app.commands.addCommand(CommandIDs.extend, {
      label: trans.__('Extend GPU Time…'),
      execute: () => actions.extend()
    });
    app.commands.addCommand(CommandIDs.checkpoint, {
      label: trans.__('Checkpoint Notebooks Now'),
      execute: () => actions.checkpoint()
    });
    app.commands.addCommand(CommandIDs.stop, {
      label: trans.__('Stop Server and Give GPU Back…'),
      execute: () => actions.stop()
    });

    if (statusBar) {
      const item = new GpuStatusItem({ poller, trans, onOpen: openPanel });
      statusBar.registerStatusItem(PLUGIN_ID + ':status', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => true
      });
    }

    const warnings = new WarningNotifier({
      trans,
      actions,
      storageKey: `jupyter-gpu-gov:warning:${settings.baseUrl}`
    });
    let checkpointHandled: string | null = null;
    let previousVerdict: IVerdict | null = null;
    void app.restored.then(() => {
      void announceComingBack({
        api,
        trans,
        openPath,
        storageKey: `jupyter-gpu-gov:dismissed-checkpoints:${settings.baseUrl}`
      }).catch(error =>
        console.warn('jupyter-gpu-gov: could not list checkpoints', error)
      );
      warnings.restore();
      poller.changed.connect((_, report) => {
        if (!report) {
          return;
        }
        warnings.update(report.verdict ?? null);
        const decided = approvalOutcome(previousVerdict, report.verdict, {
          now: Date.now(),
          trans
        });
        if (decided) {
          notify(decided);
        }
        previousVerdict = report.verdict ?? null;
        const due = checkpointDue(report.verdict, checkpointHandled);
        if (due !== null) {
          checkpointHandled = due;
          void runCheckpoint('requested by the GPU governor');
        }
      });
      if (poller.report) {
        warnings.update(poller.report.verdict ?? null);
      }
    });
  }
};

export default plugin;
