/**
 * jupyter-gpu-gov: this server's GPU in the status bar, a GPU panel, idle warnings with Extend /
 * Checkpoint / Stop server, saving dirty documents before a checkpoint, what was saved after
 * the governor stopped the previous server, that another of the owner's servers started from
 * the line for a GPU, and one clear state once this one is stopped.
 * Talks only to its own server extension (`/jupyter-gpu-gov/...`).
 */
import {
  IConnectionLost,
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';

import { createActions, notify } from './actions';
import { GpuGovApi } from './api';
import { addCommands } from './commands';
import { ConnectionWatch } from './connection';
import { approvalOutcome, checkpointDue } from './model/outcomes';
import { StatusPoller } from './poller';
import { DEFAULT_SETTINGS, IGpuGovSettings, readSettings } from './settings';
import { IVerdict } from './types';
import { announceComingBack } from './ui/comeback';
import { LineStartNotifier } from './ui/linestarts';
import { WarningNotifier } from './ui/warning';
import { GpuPanel, GpuStatusItem, StoppedOverlay } from './ui/widgets';

const PLUGIN_ID = 'jupyter-gpu-gov:plugin';

/** Shared by the two plugins: the main one gives it the poller. */
const connection = new ConnectionWatch();

/** Where the Hub starts this server again (its spawn page), or this page outside a Hub. */
function hubUrl(): string {
  const prefix = PageConfig.getOption('hubPrefix');
  if (!prefix) {
    return window.location.href;
  }
  const user = PageConfig.getOption('hubUser');
  const server = PageConfig.getOption('hubServerName');
  const path = URLExt.join(prefix, 'spawn', user, server);
  return PageConfig.getOption('hubHost') + path;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'GPU status, idle warnings and Extend buttons for jupyter-gpu-gov.',
  autoStart: true,
  optional: [
    IStatusBar,
    ILabShell,
    ITranslator,
    IDocumentManager,
    ICommandPalette,
    ISettingRegistry
  ],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    translator: ITranslator | null,
    docManager: IDocumentManager | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const trans = (translator ?? nullTranslator).load('jupyter_gpu_gov');
    const serverSettings = app.serviceManager.serverSettings;
    const baseUrl = serverSettings.baseUrl;
    const api = new GpuGovApi(serverSettings);
    const poller = new StatusPoller({
      api,
      events: app.serviceManager.events ?? null,
      interval: DEFAULT_SETTINGS.pollInterval * 1000
    });
    connection.poller = poller;
    const actions = createActions({ app, api, poller, trans, docManager });
    const openPath = (path: string) => {
      if (docManager) {
        docManager.openOrReveal(path);
      } else {
        void app.commands.execute('docmanager:open', { path });
      }
    };

    const panel = new GpuPanel({
      poller,
      trans,
      hubUrl: hubUrl(),
      onAction: action => void actions[action](),
      openPath
    });
    (labShell ?? app.shell).add(panel, 'right', { rank: 900 });
    const openPanel = () => app.shell.activateById(panel.id);
    addCommands({ app, actions, poller, trans, openPanel, palette });

    const item = new GpuStatusItem({ poller, trans, onOpen: openPanel });
    statusBar?.registerStatusItem(PLUGIN_ID + ':status', {
      item,
      align: 'left',
      rank: 4,
      isActive: () => item.shown,
      activeStateChanged: item.activeStateChanged
    });

    const warnings = new WarningNotifier({
      trans,
      actions,
      openPanel,
      storageKey: `jupyter-gpu-gov:warning:${baseUrl}`
    });
    const apply = (settings: IGpuGovSettings) => {
      poller.interval = settings.pollInterval * 1000;
      item.shown = settings.showStatusItem;
      warnings.style = settings.notificationStyle;
    };
    if (settingRegistry) {
      void settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(readSettings(settings.composite));
          settings.changed.connect(() =>
            apply(readSettings(settings.composite))
          );
        })
        .catch(error =>
          console.warn('jupyter-gpu-gov: settings not loaded', error)
        );
    }

    // Another of the owner's servers started from the line: said once, for all their tabs.
    const lineStarts = new LineStartNotifier({
      trans,
      storageKey: `jupyter-gpu-gov:line-starts:${PageConfig.getOption('hubUser')}`
    });

    const overlay = new StoppedOverlay({
      poller,
      trans,
      hubUrl: hubUrl(),
      covers: app.shell.node
    });
    let comeback: string | null = null;
    let checkpointHandled: string | null = null;
    let previousVerdict: IVerdict | null = null;
    const onChange = () => {
      if (poller.stopped) {
        // Nothing in this tab can act any more: one state, the way back to the Hub.
        poller.changed.disconnect(onChange);
        warnings.dispose();
        if (comeback) {
          Notification.dismiss(comeback);
        }
        overlay.show();
        return;
      }
      const verdict = poller.report?.verdict ?? null;
      warnings.update(verdict);
      lineStarts.update(verdict);
      const decided = approvalOutcome(previousVerdict, verdict, {
        now: Date.now(),
        trans
      });
      if (decided) {
        notify(decided);
      }
      previousVerdict = verdict;
      const due = checkpointDue(verdict, checkpointHandled);
      if (due !== null) {
        checkpointHandled = due;
        void actions.checkpointForGovernor();
      }
    };
    void app.restored.then(async () => {
      warnings.restore();
      poller.changed.connect(onChange);
      onChange();
      comeback = await announceComingBack({
        api,
        trans,
        openPath,
        storageKey: `jupyter-gpu-gov:dismissed-checkpoints:${baseUrl}`
      }).catch(error => {
        console.warn('jupyter-gpu-gov: could not list checkpoints', error);
        return null;
      });
    });
  }
};

/**
 * JupyterLab's answer to a failed request, replaced (a later provider of a service wins) so
 * that a stopped server shows one state, not the Hub's "Restart?" dialog over it. No
 * dependencies: JupyterLab's main plugin needs it early.
 */
const connectionLost: JupyterFrontEndPlugin<IConnectionLost> = {
  id: 'jupyter-gpu-gov:connection-lost',
  description: 'Says that the server stopped instead of asking to restart it.',
  autoStart: true,
  provides: IConnectionLost,
  activate: () => connection.lost
};

export default [plugin, connectionLost];
