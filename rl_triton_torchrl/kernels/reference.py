"""Float64 sequential references: the test oracle of every fast path.

Plain loops over time, one step at a time, written to be read: each is the recurrence in its algorithm's module
docstring, nothing more. Non-finite values: a done step, and any step whose coefficient on the carried term is
exactly zero (lambda = 0, a zero trace), does not depend on what comes after it, so a NaN or inf there stays there
(``times``). Inputs are ``[*B, T, *F]`` with any ``time_dim``; outputs are float64 in the same shape.
"""
from __future__ import annotations

import math

import torch

__all__ = [
    "linear_scan_ref",
    "gae_ref",
    "td_lambda_return_ref",
    "discounted_return_ref",
    "eligibility_traces_ref",
    "episodic_prefix_sum_ref",
    "vtrace_ref",
    "retrace_ref",
    "retrace_sum_ref",
    "retrace_discrete_ref",
    "normalize_ref",
]


def times(coef, x):
    """``coef * x`` for the term carried from the next (or previous) step: a zero coefficient means the step does not
    depend on it at all, so a NaN or inf there does not pass (0 * inf would be NaN)."""
    return torch.where(coef == 0, 0.0, coef * x)


def _time_last(x, shape, time_dim):
    """float64 copy with time last; numbers become full tensors."""
    if not isinstance(x, torch.Tensor):
        x = torch.tensor(float(x), dtype=torch.float64)
    return x.double().expand(shape).movedim(time_dim, -1).cpu().clone()


def _time_back(y, time_dim):
    return y.movedim(-1, time_dim)


def linear_scan_ref(a, b, *, reverse=False, time_dim=-2, initial_state=None):
    """h_t = a_t h_(t-1) + b_t (h_(t+1) with reverse); returns (h, final state)."""
    shape, device = b.shape, b.device
    a, b = _time_last(a, shape, time_dim), _time_last(b, shape, time_dim)
    h = torch.empty_like(b)
    state = torch.zeros(b.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    T = b.shape[-1]
    for t in (reversed(range(T)) if reverse else range(T)):
        state = times(a[..., t], state) + b[..., t]
        h[..., t] = state
    return _time_back(h, time_dim).to(device), state.to(device)


def gae_ref(reward, state_value, next_state_value, done, terminated=None, *, gamma, lmbda, time_dim=-2,
            initial_state=None):
    """Returns (advantage, value_target, advantage at t = 0)."""
    shape, device = reward.shape, reward.device
    terminated = done if terminated is None else terminated
    r, v, nv = (_time_last(x, shape, time_dim) for x in (reward, state_value, next_state_value))
    d, term = (_time_last(x, shape, time_dim).bool() for x in (done, terminated))
    g, lm = _time_last(gamma, shape, time_dim), _time_last(lmbda, shape, time_dim)
    adv = torch.empty_like(r)
    nxt = torch.zeros(r.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    for t in reversed(range(r.shape[-1])):
        bootstrap = torch.where(term[..., t], 0.0, nv[..., t])
        delta = r[..., t] + g[..., t] * bootstrap - v[..., t]
        nxt = torch.where(d[..., t], 0.0, nxt)  # a done step starts nothing after it
        nxt = adv[..., t] = delta + times(g[..., t] * lm[..., t], nxt)
    return _time_back(adv, time_dim).to(device), _time_back(adv + v, time_dim).to(device), nxt.to(device)


def td_lambda_return_ref(reward, next_state_value, done, terminated=None, *, gamma, lmbda, time_dim=-2,
                         initial_state=None, done_or_terminated=False):
    """TD(lambda) returns; returns (returns, return at t = 0).

    ``next_state_value=None`` means no bootstrap at all (reward-to-go). Without ``initial_state`` the window end
    bootstraps like a truncation. ``done_or_terminated`` treats a terminated step as done even where ``done`` is
    not set (TorchRL's TD(1) does).
    """
    shape, device = reward.shape, reward.device
    done = torch.zeros(shape, dtype=torch.bool) if done is None else done
    terminated = done if terminated is None else terminated
    r = _time_last(reward, shape, time_dim)
    nv = torch.zeros_like(r) if next_state_value is None else _time_last(next_state_value, shape, time_dim)
    d, term = (_time_last(x, shape, time_dim).bool() for x in (done, terminated))
    if done_or_terminated:
        d = d | term
    g, lm = _time_last(gamma, shape, time_dim), _time_last(lmbda, shape, time_dim)
    out = torch.empty_like(r)
    T = r.shape[-1]
    nxt = None if initial_state is None else initial_state.double().cpu()
    for t in reversed(range(T)):
        bootstrap = torch.where(term[..., t], 0.0, nv[..., t])
        if nxt is None:  # window end without a carried return: bootstrap like a truncation
            nxt = bootstrap
        follow = torch.where(d[..., t], bootstrap, nxt)
        nxt = out[..., t] = r[..., t] + g[..., t] * ((1 - lm[..., t]) * bootstrap + times(lm[..., t], follow))
    if nxt is None:  # T = 0: nothing carried
        nxt = torch.zeros(r.shape[:-1], dtype=torch.float64)
    return _time_back(out, time_dim).to(device), nxt.to(device)


def discounted_return_ref(reward, done, *, gamma, next_state_value=None, terminated=None, time_dim=-2,
                          initial_state=None, output_final_state=False):
    """Discounted return within episodes, TD(1) written without lambda: G_t = r_t + gamma_t * F_t, where F_t is
    what follows step t: the bootstrap (1 - terminated_t) V'_t after a done step, G_(t+1) after any other.

    The episode ends after a done or terminated step (a termination is a done). Without ``next_state_value`` the
    bootstrap is zero: the plain reward-to-go. Past the window end G_T is ``initial_state``; without it the window
    end bootstraps like a truncation. As TorchRL's TD(1), every step that is not terminated reads its V'_t, with
    weight done_t: a non-finite V'_t propagates even where it is not done (weight 0). Returns the returns, and with
    ``output_final_state`` also G_0 (``initial_state``, or zeros, for T = 0).
    """
    shape, device = reward.shape, reward.device
    terminated = done if terminated is None else terminated
    r = _time_last(reward, shape, time_dim)
    d = _time_last(done, shape, time_dim).bool() | _time_last(terminated, shape, time_dim).bool()
    term = _time_last(terminated, shape, time_dim).bool()
    nv = torch.zeros_like(r) if next_state_value is None else _time_last(next_state_value, shape, time_dim)
    g = _time_last(gamma, shape, time_dim)
    out = torch.empty_like(r)
    T = r.shape[-1]
    nxt = torch.zeros(r.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    for t in reversed(range(T)):
        ends = d[..., t] | (initial_state is None and t == T - 1)  # the window end without a carried return
        bootstrap = torch.where(term[..., t], 0.0, nv[..., t])
        nxt = out[..., t] = (r[..., t] + g[..., t] * ends.double() * bootstrap
                             + times(g[..., t], torch.where(ends, 0.0, nxt)))
    out = _time_back(out, time_dim).to(device)
    return (out, nxt.to(device)) if output_final_state else out


def eligibility_traces_ref(x, done, *, gamma, lmbda, time_dim=-2, initial_state=None):
    """e_t = gamma lmbda e_(t-1) + x_t, the trace zeroed after every done step; returns (traces, final state)."""
    shape, device = x.shape, x.device
    xs = _time_last(x, shape, time_dim)
    d = _time_last(done, shape, time_dim).bool()
    g, lm = _time_last(gamma, shape, time_dim), _time_last(lmbda, shape, time_dim)
    out = torch.empty_like(xs)
    trace = torch.zeros(xs.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    for t in range(xs.shape[-1]):
        trace = out[..., t] = times(g[..., t] * lm[..., t], trace) + xs[..., t]
        trace = torch.where(d[..., t], 0.0, trace)  # the episode ends after step t: nothing enters step t + 1
    return _time_back(out, time_dim).to(device), trace.to(device)


def episodic_prefix_sum_ref(x, boundary, *, reset, discount=1.0, time_dim=-2, initial_state=None):
    """S_t = discount_t S_(t-1) + x_t, restarted after a flagged step ("after_done") or at one ("at_start").

    Returns (sums, final state).
    """
    assert reset in ("after_done", "at_start"), reset
    shape, device = x.shape, x.device
    xs = _time_last(x, shape, time_dim)
    f = _time_last(boundary, shape, time_dim).bool()
    g = _time_last(discount, shape, time_dim)
    out = torch.empty_like(xs)
    total = torch.zeros(xs.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    for t in range(xs.shape[-1]):
        if reset == "at_start":
            total = torch.where(f[..., t], 0.0, total)  # step t starts an episode
        total = out[..., t] = times(g[..., t], total) + xs[..., t]
        if reset == "after_done":
            total = torch.where(f[..., t], 0.0, total)  # step t ends an episode
    return _time_back(out, time_dim).to(device), total.to(device)


def vtrace_ref(log_pi, log_mu, state_value, next_state_value, reward, done, terminated=None, *, gamma,
               rho_thresh=1.0, c_thresh=1.0, time_dim=-2, initial_state=None):
    """Returns (advantage, value_target vs, vs_0 - V_0).

    ``initial_state`` is vs - V at the first step after the window, whose V is taken as the last next_state_value.
    """
    shape, device = reward.shape, reward.device
    terminated = done if terminated is None else terminated
    lpi, lmu, v, nv, r = (_time_last(x, shape, time_dim) for x in (log_pi, log_mu, state_value, next_state_value,
                                                                     reward))
    d, term = (_time_last(x, shape, time_dim).bool() for x in (done, terminated))
    g, rho_bar, c_bar = (_time_last(x, shape, time_dim) for x in (gamma, rho_thresh, c_thresh))
    T = r.shape[-1]
    adv, vs = torch.empty_like(r), torch.empty_like(r)
    nxt = torch.zeros(r.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    for t in reversed(range(T)):
        ratio = torch.exp(lpi[..., t] - lmu[..., t])
        rho = torch.minimum(ratio, rho_bar[..., t])
        c = torch.minimum(ratio, c_bar[..., t])
        bootstrap = torch.where(term[..., t], 0.0, nv[..., t])
        # vs at the next step: the true next value after a done step, else the next state plus its value
        next_v = v[..., t + 1] if t + 1 < T else nv[..., t]
        vs_next = torch.where(d[..., t], nv[..., t], nxt + next_v)
        vs_next = torch.where(term[..., t], 0.0, vs_next)
        adv[..., t] = rho * (r[..., t] + g[..., t] * vs_next - v[..., t])
        delta = rho * (r[..., t] + g[..., t] * bootstrap - v[..., t])
        nxt = torch.where(d[..., t], 0.0, nxt)  # a done step starts nothing after it
        nxt = delta + times(g[..., t] * c, nxt)
        vs[..., t] = nxt + v[..., t]
    return _time_back(adv, time_dim).to(device), _time_back(vs, time_dim).to(device), nxt.to(device)


def _retrace_inputs(q_taken, next_expected_q, reward, done, terminated, ratio, log_ratio, gamma, lmbda, c_bar,
                    time_dim):
    """Retrace's inputs time-last in float64: (Q_t, E Q_(t+1), r, done, terminated, gamma, the traces c_t)."""
    shape = reward.shape
    terminated = done if terminated is None else terminated
    q, nq, r = (_time_last(x, shape, time_dim) for x in (q_taken, next_expected_q, reward))
    w = _time_last(ratio, shape, time_dim) if log_ratio is None else _time_last(log_ratio, shape, time_dim).exp()
    d, term = (_time_last(x, shape, time_dim).bool() for x in (done, terminated))
    g, lm, cb = (_time_last(x, shape, time_dim) for x in (gamma, lmbda, c_bar))
    return q, nq, r, d, term, g, lm * torch.minimum(cb, w)


def retrace_ref(q_taken, next_expected_q, reward, done, terminated=None, *, ratio=None, log_ratio=None, gamma,
                lmbda=1.0, c_bar=1.0, time_dim=-2, initial_state=None):
    """Returns (Q_ret, Q_ret - Q(s_t, a_t), c_0 (Q_ret_0 - Q_0)), written in the Q_ret form of the recurrence.

    ``initial_state`` is c_T (Q_ret_T - Q_T) at the first step after the window.
    """
    device = reward.device
    q, nq, r, d, term, g, c = _retrace_inputs(q_taken, next_expected_q, reward, done, terminated, ratio, log_ratio,
                                              gamma, lmbda, c_bar, time_dim)
    T = r.shape[-1]
    q_ret = torch.empty_like(r)
    carried = torch.zeros(r.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    for t in reversed(range(T)):
        bootstrap = torch.where(term[..., t], 0.0, nq[..., t])
        correction = carried if t == T - 1 else times(c[..., t + 1], q_ret[..., t + 1] - q[..., t + 1])
        correction = torch.where(d[..., t], 0.0, correction)  # never mix in the next episode
        q_ret[..., t] = r[..., t] + g[..., t] * bootstrap + times(g[..., t], correction)
    final = carried if T == 0 else c[..., 0] * (q_ret[..., 0] - q[..., 0])
    return _time_back(q_ret, time_dim).to(device), _time_back(q_ret - q, time_dim).to(device), final.to(device)


def retrace_sum_ref(q_taken, next_expected_q, reward, done, terminated=None, *, ratio=None, log_ratio=None, gamma,
                    lmbda=1.0, c_bar=1.0, time_dim=-2, initial_state=None):
    r"""Retrace in the sum form of Munos et al. (2016), an oracle independent of the recursion.

    .. math::

        Q^{ret}_t = Q_t + \sum_{s \ge t} \Big(\prod_{k=t}^{s-1} \gamma_k (1 - \mathrm{done}_k)\, c_{k+1}\Big)
            \delta_s, \qquad \delta_s = r_s + \gamma_s (1 - \mathrm{terminated}_s)\, \mathbb{E}_\pi Q(s'_s, \cdot) - Q_s,

    for a constant gamma and no episode end :math:`\gamma^{s-t} \prod_{i=t+1}^{s} c_i \delta_s`. Episode
    boundaries as retrace.py's module docstring defines them: a done step ends the sum (the weights past it are
    zero), a terminated one bootstraps from nothing. The carried state :math:`u_T = c_T (Q^{ret}_T - Q_T)` enters as
    the term :math:`s = T` with :math:`c_T = 1`, i.e. :math:`(\prod_{k=t}^{T-1} \gamma_k (1 - \mathrm{done}_k)
    c_{k+1}) u_T`. The :math:`s = t` term's :math:`Q_t` cancels the leading :math:`Q_t` and is left out (so a
    non-finite :math:`Q_t` stays in its advantage, as in the recursion), and a zero weight adds nothing, not even a
    NaN. O(T^2): for short sequences. Returns (Q_ret, Q_ret - Q(s_t, a_t), c_0 (Q_ret_0 - Q_0)).
    """
    device = reward.device
    q, nq, r, d, term, g, c = _retrace_inputs(q_taken, next_expected_q, reward, done, terminated, ratio, log_ratio,
                                              gamma, lmbda, c_bar, time_dim)
    T = r.shape[-1]
    u_T = torch.zeros(r.shape[:-1], dtype=torch.float64) if initial_state is None else initial_state.double().cpu()
    delta = r + g * torch.where(term, 0.0, nq) - q
    q_ret = torch.empty_like(r)
    for t in range(T):
        total = r[..., t] + g[..., t] * torch.where(term[..., t], 0.0, nq[..., t])  # Q_t + delta_t
        weight = torch.ones_like(total)  # the product of the factors gamma_k (1 - done_k) c_(k+1), k = t .. s-1
        for s in range(t + 1, T + 1):
            c_s = c[..., s] if s < T else torch.ones_like(total)
            weight = times(weight, torch.where(d[..., s - 1], 0.0, times(g[..., s - 1], c_s)))
            total = total + times(weight, delta[..., s] if s < T else u_T)
        q_ret[..., t] = total
    final = u_T if T == 0 else c[..., 0] * (q_ret[..., 0] - q[..., 0])
    return _time_back(q_ret, time_dim).to(device), _time_back(q_ret - q, time_dim).to(device), final.to(device)


def retrace_discrete_ref(pi, action, q_values, next_pi, next_q_values, reward, done, terminated=None, *,
                         behavior_prob=None, behavior_log_prob=None, time_dim=-2, **kw):
    """Retrace from per-action tensors ``[*B, T, A]``: the expectation and the gathers written out, then
    ``retrace_ref``."""
    A = pi.shape[-1]
    pi, q, npi, nq = (x.double() for x in (pi, q_values, next_pi, next_q_values))
    one_hot = torch.nn.functional.one_hot(action, A).double()
    q_taken = torch.where(one_hot > 0, q, 0.0).sum(-1)  # the taken action's entry alone (a gather)
    pi_taken = torch.where(one_hot > 0, pi, 0.0).sum(-1)
    next_expected_q = torch.zeros(nq.shape[:-1], dtype=torch.float64, device=nq.device)
    for a in range(A):
        next_expected_q += npi[..., a] * nq[..., a]
    if behavior_log_prob is None:
        w = {"ratio": pi_taken / behavior_prob.double()}
    else:
        w = {"log_ratio": pi_taken.log() - behavior_log_prob.double()}
    return retrace_ref(q_taken, next_expected_q, reward.double(), done, terminated, time_dim=time_dim % pi.dim(),
                       **w, **kw)


def normalize_ref(x, eps=1e-8):
    """``normalize_``'s standardisation in two exactly summed float64 passes: ``(x - mean) / (std + eps)``, the
    standard deviation with Bessel's correction (NaN for one element)."""
    values = x.double().cpu().flatten().tolist()
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else math.nan
    return ((x.double().cpu() - mean) / (math.sqrt(var) + eps))
