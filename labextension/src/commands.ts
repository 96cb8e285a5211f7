/**
 * The extension's commands, in the command palette under "GPU": show the panel, extend,
 * checkpoint, stop. Each is enabled only while it can act (never once the server is gone).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { IGpuGovActions } from './actions';
import { extendView } from './model/warning';
import { StatusPoller } from './poller';
import { ITrans } from './trans';

export const CommandIDs = {
  open: 'jupyter-gpu-gov:open-panel',
  extend: 'jupyter-gpu-gov:extend',
  checkpoint: 'jupyter-gpu-gov:checkpoint',
  stop: 'jupyter-gpu-gov:stop-server'
} as const;

export function addCommands(options: {
  app: JupyterFrontEnd;
  actions: IGpuGovActions;
  poller: StatusPoller;
  trans: ITrans;
  openPanel: () => void;
  palette: ICommandPalette | null;
}): void {
  const { app, actions, poller, trans, openPanel, palette } = options;
  const running = () => !poller.stopped;
  const governed = () => running() && !!poller.report?.verdict;
  app.commands.addCommand(CommandIDs.open, {
    label: trans.__('Show GPU Panel'),
    caption: trans.__('This server’s GPU, who holds it and idle warnings'),
    execute: openPanel
  });
  app.commands.addCommand(CommandIDs.extend, {
    label: trans.__('Extend GPU Time…'),
    caption: () => extendView(poller.report?.verdict, trans).hint,
    isEnabled: () =>
      running() && extendView(poller.report?.verdict, trans).enabled,
    execute: () => actions.extend()
  });
  app.commands.addCommand(CommandIDs.checkpoint, {
    label: trans.__('Checkpoint Notebooks Now'),
    caption: trans.__('Save open documents and checkpoint every notebook'),
    isEnabled: running,
    execute: () => actions.checkpoint()
  });
  app.commands.addCommand(CommandIDs.stop, {
    label: trans.__('Stop Server and Give GPU Back…'),
    caption: trans.__('Asks for confirmation first'),
    isEnabled: governed,
    execute: () => actions.stop()
  });
  // The palette and menus ask isEnabled again when told the state changed.
  poller.changed.connect(() => app.commands.notifyCommandChanged());
  if (palette) {
    const category = trans.__('GPU');
    for (const command of Object.values(CommandIDs)) {
      palette.addItem({ command, category });
    }
  }
}
