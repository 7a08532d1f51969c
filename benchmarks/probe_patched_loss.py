"""Where a patched process's TorchRL loss rows lose time: one process per mode, ``plain`` (TorchRL alone),
``imported`` (this package imported, TorchRL not patched) or ``patched`` (``patch_torchrl()``), on a CUDA machine.

    for m in plain imported patched; do python benchmarks/probe_patched_loss.py $m; done
    python benchmarks/probe_patched_loss.py ab      # one process: TorchRL's and our TD(0) in the same DQN loss

Prints, before and after one GAE functional call at 300 x 500 (TorchRL's ``test_values`` shape): the median of a
SymLog value-transform round trip on a CPU tensor of 2^20 elements (no estimator involved) and of a DQN loss forward
on CUDA (TorchRL's ``test_dqn_speed`` row: its TD(0) value estimator is ours when patched), the Python threads and
torch's CPU threads; then cProfile's top functions over 300 DQN loss calls. ``ab`` takes the processes' spread out:
three DQN losses on one network in one process, two with TorchRL's TD(0) estimator (the second one the A/A control:
its ratio to the first is the method's noise) and one built under ``torchrl_patched()`` (ours), timed in 20 blocks
of 200 calls, the order reversed every other block (CUDA if available, else CPU); and each loss's ``value_estimate``
timed inside its calls, which the rest of the loss does not blur.
"""
import cProfile, io, pstats, statistics, sys, threading, time
import torch
mode = sys.argv[1]
if mode == "ab":
    import torch.nn.functional as F
    from tensordict import TensorDict
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    import rl_triton_torchrl

    dev = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    actor = QValueActor(MLP(in_features=8, out_features=4, depth=3, num_cells=128, device=dev), in_keys=["obs"],
                        action_space="one-hot")
    losses = {"torchrl": DQNLoss(value_network=actor, action_space="one-hot"),
              "torchrl_again": DQNLoss(value_network=actor, action_space="one-hot")}  # the A/A control
    for loss in losses.values():
        loss.make_value_estimator()
    with rl_triton_torchrl.torchrl_patched():  # the registry gives the loss its default estimator: ours
        losses["ours"] = DQNLoss(value_network=actor, action_space="one-hot")
        losses["ours"].make_value_estimator()
    td = TensorDict({"obs": torch.randn(128, 8), "action": F.one_hot(torch.randint(4, (128,))),
                     "next": {"obs": torch.randn(128, 8), "done": torch.zeros(128, 1, dtype=torch.bool),
                              "reward": torch.randn(128, 1)}}, [128], device=dev)
    out = {k: loss(td) for k, loss in losses.items()}
    assert all(torch.equal(out["torchrl"][k], out["ours"][k]) for k in out["torchrl"].keys()), "losses differ"
    inside = {k: [] for k in losses}  # each call's value_estimate, timed inside the loss (device work not awaited)

    def timed(estimate, times):
        def call(*args, **kwargs):
            t0 = time.perf_counter(); result = estimate(*args, **kwargs); times.append(time.perf_counter() - t0)
            return result
        return call

    for name, loss in losses.items():
        loss.value_estimator.value_estimate = timed(loss.value_estimator.value_estimate, inside[name])
    blocks = {k: [] for k in losses}
    for i in range(20):
        for name, loss in sorted(losses.items(), reverse=i % 2 == 1):  # each first in every other round
            for _ in range(20):
                loss(td)
            ts = []
            for _ in range(200):
                t0 = time.perf_counter(); loss(td); ts.append(time.perf_counter() - t0)
            blocks[name].append(statistics.median(ts) * 1e3)
    m = {k: statistics.median(v) for k, v in blocks.items()}
    print(f"ab on {dev}: DQN loss forward, median over 20 blocks of the blocks' medians: TorchRL's TD(0) "
          f"{m['torchrl']:.4f} ms, ours {m['ours']:.4f} ms (ours / TorchRL {m['ours'] / m['torchrl']:.3f}; "
          f"A/A control, a second loss with TorchRL's: {m['torchrl_again'] / m['torchrl']:.3f}); "
          f"estimator classes {[type(v.value_estimator).__module__ for v in losses.values()]}")
    e = {k: statistics.median(v) * 1e6 for k, v in inside.items()}
    print(f"ab on {dev}: value_estimate inside the loss, median of {len(inside['ours'])} calls: TorchRL's "
          f"{e['torchrl']:.1f} µs, ours {e['ours']:.1f} µs (difference {e['ours'] - e['torchrl']:+.1f} µs; A/A "
          f"{e['torchrl_again'] - e['torchrl']:+.1f} µs)")
    sys.exit(0)
if mode != "plain":
    import rl_triton_torchrl
    if mode == "patched":
        rl_triton_torchrl.patch_torchrl()
import torch.nn.functional as F
from tensordict import TensorDict
from torchrl.modules import MLP, QValueActor, SymLogValueTransform
from torchrl.objectives import DQNLoss
from torchrl.objectives.value.functional import generalized_advantage_estimate as gae_fn
dev = torch.device("cuda:0")
torch.manual_seed(0)
t = SymLogValueTransform(); x = torch.randn(2**20)
net = MLP(in_features=8, out_features=4, depth=3, num_cells=128, device=dev)
loss = DQNLoss(value_network=QValueActor(net, in_keys=["obs"], action_space="one-hot"), action_space="one-hot")
td = TensorDict({"obs": torch.randn(128, 8), "action": F.one_hot(torch.randint(4, (128,))),
                 "next": {"obs": torch.randn(128, 8), "done": torch.zeros(128, 1, dtype=torch.bool),
                          "reward": torch.randn(128, 1)}}, [128], device=dev)
loss(td)
def med(f, n=300):
    for _ in range(20): f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
def report(tag):
    torch.cuda.synchronize()
    print(f"{mode} {tag}: symlog(cpu) {med(lambda: t.inverse(t(x)), 100):.3f} ms, dqn(cuda) {med(lambda: loss(td)):.4f} ms, "
          f"threads {[th.name for th in threading.enumerate()]}, torch threads {torch.get_num_threads()}", flush=True)
report("start")
v = torch.randn(300, 500, 1, device=dev)
kw = dict(gamma=0.95, lmbda=0.95, state_value=v, next_state_value=torch.randn_like(v), reward=torch.randn_like(v),
          done=torch.zeros_like(v, dtype=torch.bool).bernoulli_(0.1))
gae_fn(**kw); torch.cuda.synchronize()
report("after one gae call")
pr = cProfile.Profile(); pr.enable()
for _ in range(300): loss(td)
torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(10); print(s.getvalue()[-2600:])
