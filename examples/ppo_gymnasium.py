"""PPO with TorchRL on Gymnasium's vectorized environments; ``--estimator`` swaps TorchRL's GAE for ours.

The two runs differ in one line, the class that computes the advantages (see ``GAE_CLASSES`` below)::

    from torchrl.objectives.value import GAE   # --estimator torchrl
    from rl_triton_torchrl import GAE          # --estimator triton

Everything else (environment, collector, ``ClipPPOLoss``, optimiser, seeds) is the same code.

    python examples/ppo_gymnasium.py                                  # CartPole-v1, CPU, our GAE
    python examples/ppo_gymnasium.py --estimator torchrl              # the same run with TorchRL's GAE
    python examples/ppo_gymnasium.py --env-id Pendulum-v1             # continuous actions (TanhNormal actor)

Environments are stepped by Gymnasium on the CPU. ``--vectorization`` picks how:

- ``vector_entry_point`` (the default where the id has one usable here: CartPole-v0/v1): Gymnasium's natively
  vectorised numpy implementation, one array operation per step for all environments. Gymnasium's
  ``CartPoleVectorEnv`` only autoresets in ``NEXT_STEP`` mode, which TorchRL's ``GymWrapper`` refuses, so
  ``CartPoleVectorEnvDisabledAutoreset`` below adds ``autoreset_mode=DISABLED``: ``step`` never resets, and
  ``reset(options={"reset_mask": m})`` resets the masked environments only (the semantics of Gymnasium's
  ``SyncVectorEnv`` in that mode, which TorchRL uses to reset finished environments).
- ``sync``: Gymnasium's ``SyncVectorEnv``, a Python loop over one environment object each (any id).
- ``async``: ``AsyncVectorEnv``, one subprocess per environment (for a few dozen slow environments).

On a GPU, with thousands of environments: the preset the per-iteration time breakdown is meant for (cheap numpy
stepping, so that collection does not drown the estimator; one big batch per iteration, few large minibatches)::

    python examples/ppo_gymnasium.py --device cuda --num-envs 4096 --rollout-len 32 --epochs 4 \
        --minibatch-size 16384 --lr 2.5e-3 --total-frames 8000000 --return-window 200 --no-progress \
        --out $OUT/ppo_cuda_4096envs_triton

The networks, the rollout, the estimator and the loss then live on the GPU; Gymnasium steps the environments on the
CPU, and the collector moves each batch to the GPU.

Outputs, in ``--out`` (default ``runs/ppo_<env>_<estimator>_<seed>``): ``progress.csv`` (one row per iteration:
frames, wall time, mean episode return, each loss, and the iteration's time broken down into collection, the
estimator call, the PPO update, and the whole iteration) and ``curves.png``
(return against frames and against wall time).

Episodes come from ``gymnasium.make_vec`` wrapped in TorchRL's ``GymWrapper`` with ``autoreset_mode=DISABLED``, so
TorchRL resets finished sub-environments itself. (``GymEnv(env_id, num_envs=N)`` is the shorter spelling, but with
gymnasium >= 1.1 it builds an ``AsyncVectorEnv`` in gymnasium's default ``NEXT_STEP`` autoreset mode, and TorchRL
0.14 then records each reset as an extra transition with reward 0 and a zero terminal observation.)
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ppo_args.py, beside this file
import ppo_args

# ---- arguments first (CleanRL style): --help and a wrong flag answer before torch and TorchRL are imported ----
if __name__ == "__main__":
    ARGS = ppo_args.parse_args(ppo_args.make_parser(__doc__))

# ---- the heavy imports (below the arguments on purpose) ----

import copy
import csv
import math
import time
from collections import deque

import gymnasium
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode, VectorEnv
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import GymWrapper, RewardSum, TransformedEnv
from torchrl.modules import NormalParamExtractor, OneHotCategorical, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from tqdm import tqdm

# ---- the one difference between the two runs: which class computes the advantages ----
from torchrl.objectives.value import GAE as TorchRLGAE  # --estimator torchrl
from rl_triton_torchrl import GAE as TritonGAE  # --estimator triton

GAE_CLASSES = {"torchrl": TorchRLGAE, "triton": TritonGAE}

ENV_DEFAULTS = ppo_args.ENV_DEFAULTS  # per-environment defaults; any flag given on the command line wins


class CartPoleVectorEnvDisabledAutoreset(CartPoleVectorEnv):
    """Gymnasium's numpy-vectorised CartPole with ``autoreset_mode=DISABLED``, the mode TorchRL's ``GymWrapper`` uses.

    Gymnasium's ``CartPoleVectorEnv`` resets an environment on the step after it finished (``NEXT_STEP``) and its
    ``reset`` resets all of them. Here ``step`` never resets (the physics, rewards, termination and truncation are
    the parent's, unchanged), and ``reset(options={"reset_mask": mask})`` draws a fresh initial state for the
    masked environments only, leaving the others mid-episode, as Gymnasium's ``SyncVectorEnv`` does in this mode.
    """

    metadata = {**CartPoleVectorEnv.metadata, "autoreset_mode": AutoresetMode.DISABLED}
    autoreset_mode = AutoresetMode.DISABLED  # what TorchRL reads (SyncVectorEnv has it as an attribute)

    def step(self, action):
        self.prev_done[:] = False  # the parent would reset the environments that finished on the previous step
        return super().step(action)

    def reset(self, *, seed=None, options=None):
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is None or self.state is None:
            return super().reset(seed=seed, options=options)
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must have shape ({self.num_envs},), got {mask.shape}")
        VectorEnv.reset(self, seed=seed)  # seeds np_random when a seed is given
        self.state[:, mask] = self.np_random.uniform(low=self.low, high=self.high, size=(4, int(mask.sum())))
        self.steps[mask] = 0
        return self.state.T.astype(np.float32), {}


# Gymnasium's native vector envs that autoreset in NEXT_STEP mode -> the same with autoreset_mode=DISABLED
DISABLED_AUTORESET = {CartPoleVectorEnv: CartPoleVectorEnvDisabledAutoreset}


def vector_entry_point(env_id):
    """The class ``--vectorization vector_entry_point`` builds for ``env_id``; ``ValueError`` if there is none."""
    entry_point = gymnasium.spec(env_id).vector_entry_point
    if entry_point is None:
        native = sorted(k for k, s in gymnasium.registry.items() if s.vector_entry_point is not None)
        raise ValueError(f"--vectorization vector_entry_point: {env_id} has no vector entry point (Gymnasium has one "
                         f"for {', '.join(native)}); use --vectorization sync or async")
    try:
        creator = entry_point if callable(entry_point) else load_env_creator(entry_point)
    except ImportError as error:
        raise ValueError(f"--vectorization vector_entry_point: {env_id}'s vector entry point {entry_point} "
                         f"cannot be imported ({error})") from error
    if creator in DISABLED_AUTORESET:
        return DISABLED_AUTORESET[creator]
    mode = getattr(creator, "metadata", {}).get("autoreset_mode")
    if mode not in (AutoresetMode.DISABLED, AutoresetMode.SAME_STEP):
        raise ValueError(f"--vectorization vector_entry_point: {env_id}'s vector entry point {entry_point} autoresets "
                         f"in mode {mode}, which TorchRL's GymWrapper cannot use (it needs DISABLED or SAME_STEP), "
                         f"and this example has no DISABLED version of it; use --vectorization sync or async")
    return creator


def has_vector_entry_point(env_id):
    """Whether ``--vectorization vector_entry_point`` works for ``env_id`` (it is then the default)."""
    try:
        vector_entry_point(env_id)
    except ValueError:
        return False
    return True


def make_parser(description=__doc__, prefix="ppo"):
    """The command-line flags (``ppo_args.py``; ``examples/ppo_ddp.py`` adds its own to these)."""
    return ppo_args.make_parser(description, prefix)


def parse_args(argv=None, parser=None, prefix="ppo"):
    """Parses the flags and fills in the per-environment defaults, the vectorization and the output directory."""
    return complete_args(ppo_args.parse_args(parser or make_parser(), argv, prefix))


def complete_args(args):
    """Picks ``--vectorization`` where it was not given: ``vector_entry_point`` where the id has one, else ``sync``."""
    if args.vectorization is None:
        args.vectorization = "vector_entry_point" if has_vector_entry_point(args.env_id) else "sync"
    return args


def make_env(env_id, num_envs, vectorization, device, **env_kwargs):
    """Gymnasium's vector env in TorchRL: a batch of ``num_envs`` environments, episode returns summed.

    Every ``vectorization`` autoresets in ``DISABLED`` mode, so TorchRL resets finished environments itself (see the
    module docstring). ``env_kwargs`` go to the environment's constructor (e.g. ``max_episode_steps``).
    """
    if vectorization == "vector_entry_point":
        spec = copy.copy(gymnasium.spec(env_id))
        spec.vector_entry_point = vector_entry_point(env_id)
        vector_env = gymnasium.make_vec(spec, num_envs=num_envs, vectorization_mode="vector_entry_point",
                                        **env_kwargs)
    else:
        vector_env = gymnasium.make_vec(env_id, num_envs=num_envs, vectorization_mode=vectorization,
                                        vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED}, **env_kwargs)
    return TransformedEnv(GymWrapper(vector_env, device=device), RewardSum())


def mlp(in_features, out_features, hidden, out_std):
    """Two tanh hidden layers, orthogonal initialisation; ``out_std`` scales the last layer."""
    layers = [nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
              nn.Linear(hidden, out_features)]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, out_std if layer is layers[-1] else math.sqrt(2))
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


def make_models(env, hidden, device, wrap=None):
    """Separate actor and critic MLPs for ``env``: a categorical policy over one-hot actions for discrete action
    spaces, a tanh-squashed Gaussian scaled to the bounds for boxes.

    ``wrap`` (e.g. ``DistributedDataParallel``) is applied to each MLP on ``device`` before it goes into its
    TensorDict module.
    """
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = env.action_spec_unbatched
    wrap = wrap or (lambda module: module)
    if action_spec.domain == "discrete":  # one-hot actions, categorical policy
        actor_net = TensorDictModule(wrap(mlp(obs_dim, action_spec.shape[-1], hidden, 0.01).to(device)),
                                     in_keys=["observation"], out_keys=["logits"])
        actor = ProbabilisticActor(actor_net, in_keys=["logits"], spec=action_spec,
                                   distribution_class=OneHotCategorical, return_log_prob=True)
    else:  # continuous actions in a box: a tanh-squashed Gaussian scaled to the bounds
        action_dim = action_spec.shape[-1]
        actor_net = TensorDictModule(nn.Sequential(wrap(mlp(obs_dim, 2 * action_dim, hidden, 0.01).to(device)),
                                                   NormalParamExtractor()),
                                     in_keys=["observation"], out_keys=["loc", "scale"])
        actor = ProbabilisticActor(actor_net, in_keys=["loc", "scale"], spec=action_spec,
                                   distribution_class=TanhNormal,
                                   distribution_kwargs={"low": action_spec.space.low.to(device),
                                                        "high": action_spec.space.high.to(device)},
                                   return_log_prob=True)
    critic = ValueOperator(wrap(mlp(obs_dim, 1, hidden, 1.0).to(device)), in_keys=["observation"])
    return actor.to(device), critic.to(device)


def plot_curves(rows, path, title, window):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["return_mean"] != ""]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, x, label in ((axes[0], "frames", "environment frames"), (axes[1], "wall_time_s", "wall time (s)")):
        ax.plot([float(r[x]) for r in rows], [float(r["return_mean"]) for r in rows])
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"mean return of the last {window} episodes")
    axes[0].ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


LOSS_KEYS = ("loss_objective", "loss_critic", "loss_entropy", "entropy")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_estimator_call(advantage_module, data, device):
    """Writes ``"advantage"`` and ``"value_target"`` into ``data``; returns the seconds the call took (the device
    synchronised before and after, so that the time is the estimator's own)."""
    synchronize(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        advantage_module(data)
    synchronize(device)
    return time.perf_counter() - t0


def ppo_update(loss_module, optimizer, data, args, device):
    """``args.epochs`` passes over ``data`` in shuffled minibatches of ``args.minibatch_size``, a clipped gradient
    step on each; returns the mean of each of ``LOSS_KEYS`` over the steps (the device synchronised at the end)."""
    flat = data.reshape(-1)
    sums, steps = dict.fromkeys(LOSS_KEYS, 0.0), 0
    for _ in range(args.epochs):
        for idx in torch.randperm(flat.numel(), device=device).split(args.minibatch_size):
            losses = loss_module(flat[idx])
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), args.max_grad_norm)
            optimizer.step()
            for key in sums:
                sums[key] += losses[key].detach() if key in losses.keys() else math.nan
            steps += 1
    return {key: float(value) / steps for key, value in sums.items()}  # float() synchronises


def time_shares(rows):
    """One line: the share of the summed iteration time spent in collection, the estimator call and the update."""
    total = sum(float(r["iteration_time_s"]) for r in rows)
    return "time in " + ", ".join(f"{name} {100 * sum(float(r[f'{name}_time_s']) for r in rows) / total:.2f}%"
                                  for name in ("collection", "estimator", "update"))


def main(argv=None):
    """Trains; ``argv``: the flags as a list of strings (None: the command line), or as parsed by ``ppo_args``."""
    args = complete_args(argv) if isinstance(argv, argparse.Namespace) else parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device)

    # ---- seeding ----
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    # ---- environment ----
    # Gymnasium steps on the CPU; the collector moves each batch to --device (TorchRL 0.14's GymWrapper cannot reset
    # a vector env whose tensors live on a GPU)
    env = make_env(args.env_id, args.num_envs, args.vectorization, torch.device("cpu"))
    env.set_seed(args.seed)

    # ---- model: separate actor and critic MLPs ----
    actor, critic = make_models(env, args.hidden, device)

    # ---- estimator, loss, optimiser ----
    GAE = GAE_CLASSES[args.estimator]
    gae_kwargs = dict(gamma=args.gamma, lmbda=args.lmbda, value_network=critic, average_gae=True, device=device)
    advantage_module = GAE(**gae_kwargs)
    if args.cross_check:
        other_module = GAE_CLASSES["torchrl" if args.estimator == "triton" else "triton"](**gae_kwargs)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=args.clip_epsilon, entropy_coeff=args.entropy_coeff,
                              critic_coeff=args.critic_coeff, loss_critic_type="l2", normalize_advantage=False)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=args.lr, eps=1e-5)

    frames_per_batch = args.num_envs * args.rollout_len
    num_iterations = math.ceil(args.total_frames / frames_per_batch)  # whole batches: total frames rounded up
    collector = Collector(env, actor, frames_per_batch=frames_per_batch,
                          total_frames=num_iterations * frames_per_batch, device=device, env_device="cpu",
                          auto_register_policy_transforms=False)

    # ---- training loop ----
    csv_path = os.path.join(args.out, "progress.csv")
    fields = ["iteration", "frames", "wall_time_s", "episodes", "return_mean", *LOSS_KEYS, "collection_time_s",
              "estimator_time_s", "update_time_s", "iteration_time_s", "lr"]
    if args.cross_check:
        fields += ["adv_max_abs_diff", "target_max_abs_diff"]
    rows, recent_returns, episodes, frames, first_hit = [], deque(maxlen=args.return_window), 0, 0, None
    bar = tqdm(total=num_iterations * frames_per_batch, unit="frame", disable=not args.progress,
               desc=f"ppo/{args.estimator}")
    excluded = 0.0  # seconds spent in --cross-check, kept out of the wall time

    def clock():
        return time.perf_counter() - excluded

    start = iteration_start = clock()
    with open(csv_path, "w", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=fields)
        writer.writeheader()
        for iteration, data in enumerate(collector):  # data: [num_envs, rollout_len]
            collection_time = clock() - iteration_start  # stepping the envs and the policy, batch to --device
            frames += data.numel()
            if args.anneal_lr:
                for group in optimizer.param_groups:
                    group["lr"] = args.lr * (1.0 - iteration / num_iterations)

            # the estimator call: value network on the batch and on "next", then GAE (timed)
            estimator_time = timed_estimator_call(advantage_module, data, device)
            if args.cross_check:  # the other class on a copy of the same batch
                t1 = time.perf_counter()
                with torch.no_grad():
                    check = other_module(data.exclude("advantage", "value_target").clone())
                diffs = {f"{k}_max_abs_diff": f"{(check[key] - data[key]).abs().max():.3g}"
                         for k, key in (("adv", "advantage"), ("target", "value_target"))}
                excluded += time.perf_counter() - t1

            # PPO epochs over shuffled minibatches
            t2 = clock()
            losses = ppo_update(loss_module, optimizer, data, args, device)
            update_time = clock() - t2
            collector.update_policy_weights_()

            # ---- logging ----
            done = data["next", "done"].squeeze(-1)
            finished = data["next", "episode_reward"][done].squeeze(-1).tolist()
            episodes += len(finished)
            recent_returns.extend(finished)
            mean_return = sum(recent_returns) / len(recent_returns) if recent_returns else None
            if first_hit is None and args.target_return is not None and mean_return is not None \
                    and len(recent_returns) == recent_returns.maxlen and mean_return >= args.target_return:
                first_hit = (frames, clock() - start)
            now = clock()
            row = {"iteration": iteration, "frames": frames, "wall_time_s": f"{now - start:.3f}",
                   "episodes": episodes, "return_mean": "" if mean_return is None else f"{mean_return:.2f}",
                   **{k: f"{v:.5g}" for k, v in losses.items()}, "collection_time_s": f"{collection_time:.6f}",
                   "estimator_time_s": f"{estimator_time:.6f}", "update_time_s": f"{update_time:.6f}",
                   "iteration_time_s": f"{now - iteration_start:.4f}",
                   "lr": f"{optimizer.param_groups[0]['lr']:.3g}", **(diffs if args.cross_check else {})}
            iteration_start = now
            writer.writerow(row)
            csv_file.flush()
            rows.append(row)
            bar.update(data.numel())
            bar.set_postfix(ret=row["return_mean"] or "-", fps=f"{frames / (now - start):.0f}")
    bar.close()
    collector.shutdown()
    env.close()

    plot_curves(rows, os.path.join(args.out, "curves.png"),
                f"PPO {args.env_id}, estimator={args.estimator}, seed={args.seed}", args.return_window)
    wall = float(rows[-1]["wall_time_s"])
    print(f"{args.env_id} estimator={args.estimator} seed={args.seed}: {frames} frames in {wall:.1f} s, "
          f"final mean return {rows[-1]['return_mean'] or '-'} (last {args.return_window} episodes)")
    print("  " + time_shares(rows))
    if args.target_return is not None:
        print(f"  target {args.target_return:g}: " + (f"reached at {first_hit[0]} frames, {first_hit[1]:.1f} s"
                                                      if first_hit else "not reached"))
    print(f"  wrote {csv_path} and {os.path.join(args.out, 'curves.png')}")
    return rows


if __name__ == "__main__":
    main(ARGS)
