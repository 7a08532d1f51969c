"""IMPALA-style actor-critic with V-trace on Gymnasium's vectorized environments; ``--estimator`` swaps TorchRL's
VTrace for ours.

The two runs differ in one line, the class that computes the V-trace targets (see ``VTRACE_CLASSES`` below)::

    from torchrl.objectives.value import VTrace   # --estimator torchrl
    from rl_triton_torchrl import VTrace          # --estimator triton

The actor that collects (the behaviour policy mu) is a copy of the learner's policy pi refreshed every
``--policy-lag`` learner updates, as IMPALA's actors lag their learner; so the batches are off-policy and V-trace's
importance ratios pi(a|x) / mu(a|x) are not 1. Each batch: V-trace advantage and value target from the learner's
critic and policy, then one gradient step of TorchRL's ``A2CLoss`` (policy gradient with the V-trace advantage,
squared error to the V-trace value target, entropy bonus).

    python examples/impala_vtrace.py                         # CartPole-v1, CPU, our VTrace
    python examples/impala_vtrace.py --estimator torchrl     # the same run with TorchRL's VTrace
    python examples/impala_vtrace.py --policy-lag 1          # on-policy (every ratio is 1): plain A2C

Outputs, in ``--out`` (default ``runs/impala_<env>_<estimator>_<seed>``): ``progress.csv`` (a row every
``--log-every`` batches: frames, wall time, mean episode return, each loss, the importance ratios, the time spent in
the estimator calls) and ``curves.png`` (return against frames and against wall time). Discrete-action environments
only.
"""
from __future__ import annotations

import argparse
import os


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and each flag's default where it has a value of its own."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool) or action.default is argparse.SUPPRESS:
            return action.help
        return f"{action.help} (default: %(default)s)"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--estimator", choices=["torchrl", "triton"], default="triton",
                        help="which VTrace class computes the targets: TorchRL's or rl_triton_torchrl's")
    parser.add_argument("--env-id", default="CartPole-v1", help="a Gymnasium environment with discrete actions")
    parser.add_argument("--seed", type=int, default=0, help="seed for torch and the environments")
    parser.add_argument("--device", default="cpu",
                        help="device of the networks, the rollout and the estimator (e.g. cpu, cuda); the "
                             "Gymnasium environments themselves step on the CPU")
    parser.add_argument("--num-envs", type=int, default=16, help="parallel environments")
    parser.add_argument("--vectorization", choices=["sync", "async"], default="sync",
                        help="gymnasium vector env: 'sync' steps all environments in this process, 'async' in one "
                             "subprocess each")
    parser.add_argument("--rollout-len", type=int, default=8,
                        help="steps per environment per batch: frames per batch = num_envs * rollout_len")
    parser.add_argument("--total-frames", type=int, default=400_000,
                        help="environment steps in all (rounded up to whole batches)")
    parser.add_argument("--policy-lag", type=int, default=4,
                        help="the behaviour policy is refreshed from the learner every this-many updates "
                             "(1: on-policy)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument("--no-anneal-lr", dest="anneal_lr", action="store_false",
                        help="keep the learning rate constant instead of decaying it linearly to 0")
    parser.add_argument("--gamma", type=float, default=0.99, help="discount")
    parser.add_argument("--rho-thresh", type=float, default=1.0, help="V-trace clipping of the importance ratio "
                                                                      "in the TD errors (rho bar)")
    parser.add_argument("--c-thresh", type=float, default=1.0, help="V-trace clipping of the traces (c bar)")
    parser.add_argument("--entropy-coeff", type=float, default=0.01, help="entropy bonus coefficient")
    parser.add_argument("--critic-coeff", type=float, default=0.5, help="value loss coefficient")
    parser.add_argument("--critic-loss", choices=["l2", "smooth_l1"], default="l2",
                        help="distance between the critic's value and the V-trace value target")
    parser.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping norm")
    parser.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers of actor and critic")
    parser.add_argument("--return-window", type=int, default=20,
                        help="the logged mean episode return averages the last this-many finished episodes")
    parser.add_argument("--target-return", type=float, default=475.0,
                        help="report the first frame at which the mean return reaches this")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (small networks run fastest on one)")
    parser.add_argument("--cross-check", action="store_true",
                        help="also run the other estimator class on every batch (kept out of the timings) and log "
                             "the largest absolute difference of the advantages and value targets")
    parser.add_argument("--log-every", type=int, default=10,
                        help="write a CSV row every this-many batches: times summed over them, losses and ratios "
                             "averaged, maxima (rho_max, *_max_abs_diff) over them")
    parser.add_argument("--out", help="output directory (default runs/impala_<env>_<estimator>_<seed>)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = os.path.join("runs", f"impala_{args.env_id}_{args.estimator}_{args.seed}")
    return args


# ---- arguments first (CleanRL style): --help and a wrong flag answer before torch and TorchRL are imported ----
if __name__ == "__main__":
    ARGS = parse_args()

# ---- the heavy imports (below the arguments on purpose) ----
import copy
import csv
import math
import time
from collections import deque

import gymnasium
import torch
from tensordict.nn import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential, TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import GymWrapper, RewardSum, TransformedEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import A2CLoss
from tqdm import tqdm

# ---- the one difference between the two runs: which class computes the V-trace targets ----
from torchrl.objectives.value import VTrace as TorchRLVTrace  # --estimator torchrl
from rl_triton_torchrl import VTrace as TritonVTrace  # --estimator triton

VTRACE_CLASSES = {"torchrl": TorchRLVTrace, "triton": TritonVTrace}


def make_env(env_id, num_envs, vectorization, device):
    """Gymnasium's vector env in TorchRL: a batch of ``num_envs`` environments, episode returns summed.

    ``autoreset_mode=DISABLED`` lets TorchRL reset finished sub-environments itself (see ppo_gymnasium.py for why
    not ``GymEnv(env_id, num_envs=N)``).
    """
    vector_env = gymnasium.make_vec(env_id, num_envs=num_envs, vectorization_mode=vectorization,
                                    vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.DISABLED})
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


class TakenActionOneHotCategorical(OneHotCategorical):
    """The learner's categorical policy, whose deterministic sample is the action the behaviour policy took.

    V-trace needs log pi(a_t | x_t) of the action in the batch. TorchRL 0.14's ``VTrace`` asks its
    ``actor_network`` for a distribution and scores an action it draws from it itself (the mode, or a fresh sample
    under ``ExplorationType.RANDOM``). Handing it this distribution makes that action the one taken, for both
    estimator classes alike.
    """

    def __init__(self, logits, taken_action):
        super().__init__(logits=logits)
        self.taken_action = taken_action

    @property
    def deterministic_sample(self):
        return self.taken_action


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


def main(argv=None):
    """Trains; ``argv``: the flags as a list of strings (None: the command line), or as parsed by ``parse_args``."""
    args = argv if isinstance(argv, argparse.Namespace) else parse_args(argv)
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
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = env.action_spec_unbatched
    if action_spec.domain != "discrete":
        raise SystemExit(f"{args.env_id} has continuous actions; this example handles discrete ones")

    # ---- model: the learner's actor and critic, and the lagging behaviour actor that collects ----
    logits_net = TensorDictModule(mlp(obs_dim, action_spec.shape[-1], args.hidden, 0.01),
                                  in_keys=["observation"], out_keys=["logits"])
    actor = ProbabilisticActor(logits_net, in_keys=["logits"], spec=action_spec, distribution_class=OneHotCategorical,
                               return_log_prob=True)
    critic = ValueOperator(mlp(obs_dim, 1, args.hidden, 1.0), in_keys=["observation"])
    actor.to(device)
    critic.to(device)
    behaviour_actor = copy.deepcopy(actor)  # mu: writes the action and its log-probability into each batch
    # pi on the batch's own actions, for V-trace (shares the learner's parameters)
    target_policy = ProbabilisticTensorDictSequential(
        logits_net,
        ProbabilisticTensorDictModule(in_keys={"logits": "logits", "taken_action": "action"},
                                      out_keys=["action"], distribution_class=TakenActionOneHotCategorical),
    )

    # ---- estimator, loss, optimiser ----
    VTrace = VTRACE_CLASSES[args.estimator]
    vtrace_kwargs = dict(gamma=args.gamma, value_network=critic, actor_network=target_policy,
                         rho_thresh=args.rho_thresh, c_thresh=args.c_thresh, device=device)
    advantage_module = VTrace(**vtrace_kwargs)
    if args.cross_check:
        other_module = VTRACE_CLASSES["torchrl" if args.estimator == "triton" else "triton"](**vtrace_kwargs)
    loss_module = A2CLoss(actor, critic, entropy_coeff=args.entropy_coeff, critic_coeff=args.critic_coeff,
                          loss_critic_type=args.critic_loss)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=args.lr, eps=1e-5)

    frames_per_batch = args.num_envs * args.rollout_len
    num_iterations = math.ceil(args.total_frames / frames_per_batch)
    collector = Collector(env, behaviour_actor, frames_per_batch=frames_per_batch,
                          total_frames=num_iterations * frames_per_batch, device=device, env_device="cpu",
                          auto_register_policy_transforms=False)
    log_mu_key = advantage_module.tensor_keys.sample_log_prob

    # ---- training loop ----
    csv_path = os.path.join(args.out, "progress.csv")
    mean_keys = ["loss_objective", "loss_critic", "loss_entropy", "entropy", "rho_mean", "abs_log_rho_mean"]
    max_keys = ["rho_max"] + (["adv_max_abs_diff", "target_max_abs_diff"] if args.cross_check else [])
    fields = ["iteration", "updates", "frames", "wall_time_s", "episodes", "return_mean", *mean_keys, *max_keys,
              "estimator_time_s", "iteration_time_s", "lr"]
    window = []  # per-batch numbers since the last CSV row
    rows, recent_returns, episodes, frames, first_hit = [], deque(maxlen=args.return_window), 0, 0, None
    bar = tqdm(total=num_iterations * frames_per_batch, unit="frame", disable=not args.progress,
               desc=f"impala/{args.estimator}")
    start = iteration_start = time.perf_counter()
    excluded = 0.0  # seconds spent in --cross-check, kept out of the wall time
    with open(csv_path, "w", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=fields)
        writer.writeheader()
        for iteration, data in enumerate(collector):  # data: [num_envs, rollout_len], actions from mu
            frames += data.numel()
            if args.anneal_lr:
                for group in optimizer.param_groups:
                    group["lr"] = args.lr * (1.0 - iteration / num_iterations)

            # the estimator call: critic on the batch and on "next", pi on the taken actions, then V-trace (timed)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            with torch.no_grad():
                advantage_module(data)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            estimator_time = time.perf_counter() - t0
            if args.cross_check:  # the other class on a copy of the same batch
                t1 = time.perf_counter()
                with torch.no_grad():
                    check = other_module(data.exclude("advantage", "value_target").clone())
                diffs = {f"{k}_max_abs_diff": (check[key] - data[key]).abs().max().item()
                         for k, key in (("adv", "advantage"), ("target", "value_target"))}
                excluded += time.perf_counter() - t1

            with torch.no_grad():  # the importance ratios pi(a|x) / mu(a|x) of this batch, for the log
                rho = (actor.get_dist(data).log_prob(data["action"]) - data[log_mu_key]).exp()

            # one learner update on the batch
            losses = loss_module(data)
            loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), args.max_grad_norm)
            optimizer.step()

            # the actors catch up with the learner every policy_lag updates
            if (iteration + 1) % args.policy_lag == 0:
                behaviour_actor.load_state_dict(actor.state_dict())
                collector.update_policy_weights_()

            # ---- logging: a CSV row every log_every batches ----
            logged = losses.detach()
            window.append({"estimator_time_s": estimator_time, "rho_mean": rho.mean().item(),
                           "rho_max": rho.max().item(), "abs_log_rho_mean": rho.log().abs().mean().item(),
                           **{k: float(logged.get(k, math.nan)) for k in mean_keys[:4]},
                           **(diffs if args.cross_check else {})})
            done = data["next", "done"].squeeze(-1)
            finished = data["next", "episode_reward"][done].squeeze(-1).tolist()
            episodes += len(finished)
            recent_returns.extend(finished)
            mean_return = sum(recent_returns) / len(recent_returns) if recent_returns else None
            if first_hit is None and mean_return is not None and len(recent_returns) == recent_returns.maxlen \
                    and mean_return >= args.target_return:
                first_hit = (frames, time.perf_counter() - excluded - start)
            bar.update(data.numel())
            if (iteration + 1) % args.log_every and iteration + 1 < num_iterations:
                continue
            now = time.perf_counter() - excluded
            row = {"iteration": iteration, "updates": len(window), "frames": frames,
                   "wall_time_s": f"{now - start:.3f}", "episodes": episodes,
                   "return_mean": "" if mean_return is None else f"{mean_return:.2f}",
                   **{k: f"{sum(w[k] for w in window) / len(window):.5g}" for k in mean_keys},
                   **{k: f"{max(w[k] for w in window):.4g}" for k in max_keys},
                   "estimator_time_s": f"{sum(w['estimator_time_s'] for w in window):.6f}",
                   "iteration_time_s": f"{now - iteration_start:.4f}", "lr": f"{optimizer.param_groups[0]['lr']:.3g}"}
            window, iteration_start = [], now
            writer.writerow(row)
            csv_file.flush()
            rows.append(row)
            bar.set_postfix(ret=row["return_mean"] or "-", fps=f"{frames / (now - start):.0f}")
    bar.close()
    collector.shutdown()
    env.close()

    plot_curves(rows, os.path.join(args.out, "curves.png"),
                f"IMPALA (V-trace) {args.env_id}, estimator={args.estimator}, seed={args.seed}", args.return_window)
    wall = float(rows[-1]["wall_time_s"])
    share = sum(float(r["estimator_time_s"]) for r in rows) / sum(float(r["iteration_time_s"]) for r in rows)
    print(f"{args.env_id} estimator={args.estimator} seed={args.seed}: {frames} frames in {wall:.1f} s, "
          f"final mean return {rows[-1]['return_mean'] or '-'} (last {args.return_window} episodes), "
          f"estimator {100 * share:.2f}% of iteration time")
    print(f"  target {args.target_return:g}: " + (f"reached at {first_hit[0]} frames, {first_hit[1]:.1f} s"
                                                  if first_hit else "not reached"))
    print(f"  wrote {csv_path} and {os.path.join(args.out, 'curves.png')}")
    return rows


if __name__ == "__main__":
    main(ARGS)
