/**
 * The tab after its server stopped: one sentence that says when and why ("This server was
 * stopped at 14:02 because its GPU was idle; checkpoint saved."), from what the tab saw last.
 */
import { IViewOptions, parseTime, transOf } from '../format';
import { ICheckpointManifest, IStatusReport } from '../types';
import {
  atTime,
  checkpointErrors,
  checkpointPhrase,
  cullReasonPhrase,
  governorCheckpoint
} from './comeback';

/** A checkpoint this long before the stop is still the one the stop followed. */
export const CHECKPOINT_BEFORE_STOP_MS = 15 * 60 * 1000;

export interface IStopFacts {
  /** When the tab learnt that its server is gone, ms since the epoch. */
  at: number;
  /** The person stopped it from this tab (Stop server). */
  byOwner: boolean;
  /** The last report the tab had. */
  report: IStatusReport | null;
  /** The newest checkpoint manifest the tab saw (in a report or as its own answer). */
  checkpoint?: ICheckpointManifest | null;
}

export interface IStoppedView {
  title: string;
  /** "This server was stopped at 14:02 because its GPU was idle; checkpoint saved." */
  message: string;
  /** What to do next. */
  next: string;
  /** The one button: back to the Hub to start the server again. */
  action: string;
}

/** The checkpoint the stop followed, if the tab saw one shortly before it. */
function precedingCheckpoint(facts: IStopFacts): ICheckpointManifest | null {
  const manifest = facts.checkpoint ?? facts.report?.checkpoint?.manifest;
  if (!manifest) {
    return null;
  }
  const done = parseTime(manifest.completed_at);
  if (
    done === null ||
    done > facts.at + 60 * 1000 ||
    facts.at - done > CHECKPOINT_BEFORE_STOP_MS
  ) {
    return null;
  }
  return manifest;
}

/** When it stopped: the deadline or the checkpoint the cull followed, else when the tab saw it. */
function stopTime(facts: IStopFacts, manifest: ICheckpointManifest | null) {
  const verdict = facts.report?.verdict;
  const candidates = [
    ['warned', 'checkpointing', 'culled'].includes(verdict?.state ?? '')
      ? parseTime(verdict?.cull_at)
      : null,
    parseTime(manifest?.completed_at)
  ].filter((t): t is number => t !== null && t <= facts.at);
  return candidates.length ? Math.max(...candidates) : facts.at;
}

export function stoppedView(
  facts: IStopFacts,
  options: IViewOptions
): IStoppedView {
  const trans = transOf(options);
  const manifest = precedingCheckpoint(facts);
  const when = atTime(stopTime(facts, manifest), options);
  const verdict = facts.report?.verdict;
  let because: string | null = null;
  if (manifest && governorCheckpoint(manifest)) {
    because = cullReasonPhrase(manifest.cull_reason, trans);
  }
  if (
    !because &&
    !facts.byOwner &&
    verdict?.idle_since &&
    ['warned', 'checkpointing', 'culled'].includes(verdict.state ?? 'unknown')
  ) {
    because = cullReasonPhrase('gpu-idle', trans);
  }
  const saved = manifest
    ? checkpointPhrase(
        manifest.status,
        checkpointErrors(manifest.errors).length,
        trans
      )
    : null;
  let message = facts.byOwner
    ? trans.__('You stopped this server %1', when)
    : because
      ? trans.__('This server was stopped %1 because %2', when, because)
      : trans.__('This server was stopped %1', when);
  message += saved ? `; ${saved}.` : '.';
  return {
    title: trans.__('Server stopped'),
    message,
    next: saved
      ? trans.__(
          'Start it again to keep working: JupyterLab then shows what the checkpoint saved and how to restore it.'
        )
      : trans.__('Start it again to keep working.'),
    action: trans.__('Start it again on the Hub')
  };
}
