"""What a quickstart run leaves behind: the run store (for `legorl ui`) and the results file.

The run store gets the run's config, every metric (SFT loss per logged step, GSPO metrics
per step, each evaluation's resolved rate) and trajectories down to the token: every
real-harness episode (expert demonstrations and harness evaluations), and a sample of
the in-process ones (the first `sample_groups` groups of each GSPO step, the first
`sample_eval` episodes of each evaluation) — storing all ~6k in-process episodes would
cost the run more time than it has.

`quickstart_results.json` holds the before/after table (three resolved rates with their
episode counts and 95% intervals, per path), GSPO's gain over its SFT starting checkpoint
with Newcombe's 95% interval, wall time per phase, and what ran where.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from legorl.quickstart.evaluate import Evaluation, newcombe_diff, summarize, table
from legorl.quickstart.family import QuickTask
from legorl.train.advantages import compute_advantages
from legorl.trajectory import assemble
from legorl.types import Trajectory, Turn

_FIX = re.compile(r"sed -i 's\|\^def (\w+)")
RESULTS_FILE = "quickstart_results.json"


def choice_of(task: QuickTask, turns: Sequence[Turn]) -> str:
    """Which function the episode's last fix command rewrote: the failing one, the first
    one the test output mentions (the expert's habit), another one, or none."""
    for turn in reversed(turns):
        m = _FIX.search(turn.response_text)
        if m:
            name = m.group(1)
            return "failing" if name == task.buggy else "first" if name == task.names[0] else "other"
    return "none"


class Recorder:
    def __init__(self, out_dir: Path, cfg: Any, tokenizer: Any, sample_groups: int = 1, sample_eval: int = 32) -> None:
        self.out_dir = out_dir
        self.tok = tokenizer
        self.sample_groups = sample_groups
        self.sample_eval = sample_eval
        self.store = None
        self.log_lines: list[str] = []
        try:
            from legorl.monitor.store import RunStore
        except ImportError:  # the monitor is an optional part of an install
            RunStore = None
        if RunStore is not None:
            self.store = RunStore(out_dir, durable=False, run_name="quickstart", config=cfg.model_dump(mode="json"))

    # -- helpers -----------------------------------------------------------------------------
    def say(self, line: str) -> None:
        """Progress goes to stderr (stdout stays free for a caller's JSON) and to quickstart.log."""
        print(line, file=sys.stderr, flush=True)
        self.log_lines.append(line)

    def _store_episode(self, traj: Trajectory, turns: Sequence[Turn]) -> None:
        if self.store is None:
            return
        self.store.start_session(traj.session_id, step=traj.step, instance_id=traj.instance_id, harness=traj.harness)
        for turn in turns:
            self.store.add_turn(turn, pieces=[self.tok.decode([i]) for i in turn.completion_ids])
        self.store.add_trajectory(traj)

    def harness_trajectory(self, ep: Any, step: int, label: str) -> Trajectory:
        traj = assemble(ep.turns, ep.session_id)
        traj.instance_id, traj.harness, traj.step, traj.outcome = ep.task.instance_id, "mini-swe-agent", step, ep.outcome
        if traj.outcome is not None:
            traj.outcome.evidence["exit_status"] = ep.exit_status
            traj.outcome.evidence["phase"] = label
        self._store_episode(traj, ep.turns)
        return traj

    # -- phases ------------------------------------------------------------------------------
    def demos(self, trajs: Sequence[Trajectory], path: str, turns: Sequence[Sequence[Turn]] | None = None) -> None:
        """Report the expert data; `turns` stores in-process demonstrations (harness ones
        were stored as they were graded)."""
        for traj, ts in zip(trajs, turns or []):
            self._store_episode(traj, ts)
        ok = sum(1 for t in trajs if t.outcome is not None and t.outcome.reward > 0)
        self.say(f"expert data: {len(trajs)} episodes via {path}, expert resolved {ok / max(len(trajs), 1):.1%}")
        if self.store is not None:
            self.store.log_metrics(0, {"expert/resolved_rate": ok / max(len(trajs), 1), "expert/episodes": len(trajs)})

    def sft_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.say(f"sft step {step}: loss {metrics['sft/loss']:.4f} ({metrics['sft/elapsed_s']:.0f}s)")
        if self.store is not None:
            self.store.log_metrics(step, metrics)

    def rl_step(self, step: int, episodes: Sequence[Any], trajs: Sequence[Trajectory], metrics: dict[str, float],
                group_size: int) -> None:  # fmt: skip
        self.say(f"gspo step {step - 2}: resolved {metrics['reward/resolved_rate']:.1%} "
                 f"(rollout {metrics['time/rollout_s']:.1f}s, train {metrics['time/train_s']:.1f}s)")  # fmt: skip
        if self.store is None:
            return
        self.store.begin_step(step, policy_version=step - 2)
        sample = list(zip(episodes, trajs))[: self.sample_groups * group_size]
        for e, traj in sample:
            self._store_episode(traj, e.turns)
        adv = compute_advantages([t for _, t in sample])  # what the trainer computed for these groups
        self.store.set_advantages({t.session_id: a for (_, t), a in zip(sample, adv.values) if a is not None})
        self.store.log_metrics(step, {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        self.store.end_step(step)

    def evaluation(self, label: str, eps: Sequence[Any], wall_s: float, step: int) -> Evaluation:
        ev = summarize(label, [(e.resolved, str(e.outcome.status), choice_of(e.info["task"], e.turns)) for e in eps],
                       wall_s, "in-process")  # fmt: skip
        self.say(f"eval {label} (in-process): {ev.resolved}/{ev.episodes} = {ev.rate:.1%}  choices {ev.choices}")
        if self.store is not None:
            from legorl.quickstart.rl import trajectory_of

            for e in eps[: self.sample_eval]:
                self._store_episode(trajectory_of(e, step), e.turns)
            self.store.log_metrics(step, {f"eval/{_key(label)}/resolved_rate": ev.rate})
        return ev

    def harness_evaluation(self, label: str, eps: Sequence[Any], trajs: Sequence[Trajectory], wall_s: float,
                           step: int, parity: dict[str, int], same_tasks_in_process: int) -> Evaluation:  # fmt: skip
        """`same_tasks_in_process`: how many of these tasks the in-process evaluation of the
        same checkpoint resolved (a paired comparison of the two paths)."""
        ev = summarize(label, [(e.resolved, str(e.outcome.status), choice_of(e.task, e.turns)) for e in eps],
                       wall_s, "harness")  # fmt: skip
        ev.extra = {"replay_parity_turns": [parity["turns_identical"], parity["turns_compared"]],
                    "in_process_resolved_same_tasks": same_tasks_in_process}  # fmt: skip
        self.say(f"eval {label} (mini-swe-agent): {ev.resolved}/{ev.episodes} = {ev.rate:.1%} (in process, same "
                 f"tasks: {same_tasks_in_process}/{ev.episodes}); replay parity {parity['turns_identical']}/"
                 f"{parity['turns_compared']} turns with identical prompt ids")  # fmt: skip
        if self.store is not None:
            self.store.log_metrics(step, {f"eval_harness/{_key(label)}/resolved_rate": ev.rate})
        return ev

    def finish(self, cfg: Any, evals: dict[str, dict[str, Evaluation]], phases: dict[str, float], total_s: float) -> dict[str, Any]:
        rows = {name: {path: ev.as_dict() for path, ev in by_path.items()} for name, by_path in evals.items()}
        sft_ev, rl_ev = evals["after_sft"]["in-process"], evals["after_gspo"]["in-process"]
        gain = _gain(sft_ev, rl_ev)
        gain["meets_15_points"] = gain["points"] >= 15.0
        results = {
            "table": rows,
            "gspo_gain_over_sft": gain,
            "wall_s": round(total_s, 1),
            "run_dir": str(self.out_dir),
            "within_budget": total_s <= cfg.time_budget_s,
            "phases_s": phases,
            "config": cfg.model_dump(mode="json"),
            "real_in_the_loop": {
                "expert_data": "mini-swe-agent 2.x (DefaultAgent, litellm_textbased) -> HTTP -> proxy -> expert engine"
                if cfg.harness != "none" else "in-process dialogue (harness = none)",
                "evaluation_all_episodes": "in-process: mini-swe-agent's messages via the proxy renderer; real commands",
                "evaluation_subset": f"{cfg.harness_eval_episodes} episodes per checkpoint through mini-swe-agent + "
                "proxy + hf engine" if cfg.harness != "none" else "none",
                "gspo_rollouts": "in-process (same messages, real commands, fresh-directory grading)",
                "gspo_loss": "legorl.train.trainer.Trainer (loss=gspo, sequence_unit=trajectory)",
            },
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        if "control_more_sft" in evals:
            control = evals["control_more_sft"]["in-process"]
            results["control_more_sft"] = {
                "gain_over_sft": _gain(sft_ev, control),
                "gspo_minus_control": _gain(control, rl_ev),
                "extra_sft_steps": cfg.control_sft_steps,
            }
        text = table([evals[n][p] for n in evals for p in evals[n]])
        self.say(text)
        self.say(f"GSPO gain over its SFT start: {gain['points']:+.1f} points, 95% CI "
                 f"[{gain['ci95_points'][0]:+.1f}, {gain['ci95_points'][1]:+.1f}]; total {total_s:.0f}s")  # fmt: skip
        if "control_more_sft" in results:
            c = results["control_more_sft"]["gain_over_sft"]
            self.say(f"control, {cfg.control_sft_steps} more SFT steps instead of GSPO: {c['points']:+.1f} points, "
                     f"95% CI [{c['ci95_points'][0]:+.1f}, {c['ci95_points'][1]:+.1f}]")  # fmt: skip
        results["table_text"] = text
        (self.out_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2))
        if self.store is not None:
            self.store.set_run_info(info={"quickstart": {"gain": gain, "wall_s": results["wall_s"]}})
        return results

    def close(self) -> None:
        """Write the progress log and close the store (also after a failed run)."""
        (self.out_dir / "quickstart.log").write_text("\n".join(self.log_lines) + "\n")
        if self.store is not None:
            self.store.close()
            self.store = None


def _gain(before: Evaluation, after: Evaluation) -> dict[str, Any]:
    """after − before in points, with Newcombe's 95% interval."""
    d, low, high = newcombe_diff(before.resolved, before.episodes, after.resolved, after.episodes)
    return {"points": round(100 * d, 1), "ci95_points": [round(100 * low, 1), round(100 * high, 1)],
            "excludes_zero": low > 0}  # fmt: skip


def _key(label: str) -> str:
    return label.lower().replace(" ", "_")
