"""The exact optimum of a small planning instance, two ways: a MILP (solve,
scipy's milp, HiGHS) and dynamic programming over subsets (by_subsets).

Same contract as the planners (scheduler/planner.h): M microbatches of N
ranks; each microbatch's ranks tiled by CP groups (aligned power-of-two
blocks, or with any_size any contiguous block); every sequence in exactly one
group of a size at least its own; every rank of every used microbatch holds a
sequence; per-rank padded tokens within the cap; CP inflation within the
budget. Objective: the modelled step time without a pipeline,
Σ_m (max over the microbatch's groups of their per-rank cost + μ).
"""

import functools
import math

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp


def padded(length, c):
    divisor = 1 if c == 1 else 2 * c
    return -(-length // divisor) * divisor


def own_cp(length, cap, n):
    c = 1
    while -(-padded(length, c) // c) > cap:
        c *= 2
        if c > n:
            raise ValueError(f"a sequence of {length} does not fit {n} ranks of {cap}")
    return c


def cost(model, s, c):
    value = (model["alpha"] * s * s + model["beta"] * s) / c
    if c > 1:
        value += model["kappa"] * s * (c - 1) / c + model["lambda"] * (c - 1)
    return value


def blocks(n, any_size):
    if any_size:
        return [(first, size) for size in range(1, n + 1) for first in range(0, n - size + 1)]
    out, size = [], 1
    while size <= n:
        out += [(first, size) for first in range(0, n, size)]
        size *= 2
    return out


def step_time(microbatches, model):
    """Σ_m (max group per-rank cost + μ) of [[(first, size, [lengths...]), ...], ...]."""
    return sum(max(sum(cost(model, padded(s, size), size) for s in seqs)
                   for _, size, seqs in groups) + model["microbatch"]
               for groups in microbatches)


def dumped_microbatches(entry):
    """One step of `packfeedctl plan --dump-plan` as step_time takes it:
    per microbatch, its groups as (first rank, size, [lengths...])."""
    microbatches = []
    for per_rank in entry["microbatches"]:
        groups = {}
        for sequences in per_rank:
            for q in sequences:
                groups.setdefault((q["cp_group"], q["cp_size"]), set()).add(
                    (q["sample"], q["length"]))
        microbatches.append([(g * c, c, [length for _, length in members])
                             for (g, c), members in groups.items()])
    return microbatches


def inflation(microbatches, cap, n):
    """CP inflation as the planners count it: Σ padded at c · (c / own − 1)
    over Σ padded at own, for microbatches as step_time takes them."""
    spent = tokens = 0
    for groups in microbatches:
        for _, size, seqs in groups:
            for s in seqs:
                own = own_cp(s, cap, n)
                tokens += padded(s, own)
                spent += padded(s, size) * (size / own - 1)
    return spent / tokens


def _instance(lengths, n, cap, max_rows, at_least_default_rows):
    """Each sequence's own CP size, the padded tokens at those sizes, and
    how many microbatches a plan may use (solve's docstring)."""
    own = [own_cp(s, cap, n) for s in lengths]
    tokens = sum(padded(s, c) for s, c in zip(lengths, own))
    lower = -(-tokens // (n * cap))
    rows = max_rows or lower + 2
    if at_least_default_rows:
        rows = max(rows, lower + 2)
    return own, tokens, min(len(lengths), rows)


def solve(lengths, n, cap, model, budget=None, max_rows=None, any_size=False, time_limit=60,
          at_least_default_rows=False, at_most=None):
    """(optimal step time, microbatches) or None when infeasible. Up to
    max_rows microbatches (default: the token lower bound + 2; with
    at_least_default_rows, the larger of the two). With at_most, only plans
    of a step time up to it count: given a known plan's time, the search
    prunes everything worse from the start."""
    own, tokens, rows = _instance(lengths, n, cap, max_rows, at_least_default_rows)
    groups = blocks(n, any_size)
    index = {}

    def var(key):
        index.setdefault(key, len(index))
        return index[key]

    for m in range(rows):
        var(("z", m))
        var(("t", m))
        for g in range(len(groups)):
            var(("y", m, g))
            for i, s in enumerate(lengths):
                size = groups[g][1]
                if size >= own[i] and -(-padded(s, size) // size) <= cap:
                    var(("x", i, m, g))
    count = len(index)
    # Costs in units of a full rank's sequence, so that HiGHS sees
    # coefficients near 1 (raw s² figures made it stop at a worse plan).
    unit = cost(model, cap, 1)
    objective = np.zeros(count)
    integral = np.ones(count)
    upper = np.ones(count)
    for m in range(rows):
        objective[index[("t", m)]] = 1.0
        objective[index[("z", m)]] = model["microbatch"] / unit
        integral[index[("t", m)]] = 0
        upper[index[("t", m)]] = np.inf
    rows_a, lo, hi = [], [], []

    def constraint(terms, low, high):
        rows_a.append(terms)
        lo.append(low)
        hi.append(high)

    xs = [k for k in index if k[0] == "x"]
    by_group = {}
    for k in xs:
        by_group.setdefault((k[2], k[3]), []).append(k)
    for i in range(len(lengths)):  # placed exactly once
        constraint({index[k]: 1 for k in xs if k[1] == i}, 1, 1)
    for m in range(rows):
        if m + 1 < rows:  # used microbatches first, costliest first (no symmetric twins)
            constraint({index[("z", m)]: 1, index[("z", m + 1)]: -1}, 0, np.inf)
            constraint({index[("t", m)]: 1, index[("t", m + 1)]: -1}, 0, np.inf)
        for r in range(n):  # tiled when used
            terms = {index[("y", m, g)]: 1 for g, (first, size) in enumerate(groups)
                     if first <= r < first + size}
            terms[index[("z", m)]] = -1
            constraint(terms, 0, 0)
        for g, (first, size) in enumerate(groups):
            members = by_group.get((m, g), [])
            y = index[("y", m, g)]
            # A group holds a sequence, within the cap (which also keeps
            # sequences out of unused groups), and costs at most t_m.
            constraint({**{index[k]: 1 for k in members}, y: -1}, 0, np.inf)
            constraint({**{index[k]: -(-padded(lengths[k[1]], size) // size) / cap
                           for k in members}, y: -1}, -np.inf, 0)
            constraint({**{index[k]: cost(model, padded(lengths[k[1]], size), size) / unit
                           for k in members}, index[("t", m)]: -1}, -np.inf, 0)
        # Valid and tightening: t_m is at least the ranks' average cost, each
        # group's per-rank cost weighted by its share of the n ranks.
        average = {index[k]: cost(model, padded(lengths[k[1]], groups[k[3]][1]), groups[k[3]][1])
                   * groups[k[3]][1] / (n * unit) for g in range(len(groups))
                   for k in by_group.get((m, g), [])}
        average[index[("t", m)]] = -1
        constraint(average, -np.inf, 0)
    if budget is not None:
        terms = {}
        for k in xs:
            size = groups[k[3]][1]
            i = k[1]
            if size > own[i]:
                terms[index[k]] = padded(lengths[i], size) * (size / own[i] - 1) / tokens
        if terms:
            constraint(terms, -np.inf, budget)
    if at_most is not None:
        constraint({i: objective[i] for i in range(count) if objective[i]}, -np.inf,
                   at_most / unit)
    entries = [(row, column, value) for row, terms in enumerate(rows_a)
               for column, value in terms.items()]
    r, c, v = zip(*entries)
    a = sparse.csr_array((v, (r, c)), shape=(len(rows_a), count))
    result = milp(objective, integrality=integral, bounds=Bounds(np.zeros(count), upper),
                  constraints=LinearConstraint(a, lo, hi),
                  # The presolve of the HiGHS in Debian's scipy 1.10 was seen to cut off the optimum
                  # of these models; solving without it is exact and fast enough.
                  options={"time_limit": time_limit, "mip_rel_gap": 1e-6, "presolve": False})
    if result.x is None:
        return None
    plan = []
    for m in range(rows):
        if result.x[index[("z", m)]] < 0.5:
            continue
        used = []
        for g, (first, size) in enumerate(groups):
            if result.x[index[("y", m, g)]] > 0.5:
                seqs = [lengths[k[1]] for k in xs
                        if k[2] == m and k[3] == g and result.x[index[k]] > 0.5]
                used.append((first, size, seqs))
        plan.append(used)
    return step_time(plan, model), plan


def _pareto(options, limit):
    """The options (time, spent, plan) that no other beats on both time and
    CP tokens spent, within the spending limit; cheapest first."""
    kept, least = [], math.inf
    for option in sorted(options, key=lambda o: (o[0], o[1])):
        if option[1] <= limit and option[1] < least:
            kept.append(option)
            least = option[1]
    return kept


def _submasks_with_lowest(mask):
    """Every subset of mask holding its lowest member: each way to choose the
    part that member belongs to, so that every partition is seen once."""
    lowest = mask & -mask
    sub = mask
    while sub:
        if sub & lowest:
            yield sub
        sub = (sub - 1) & mask


def by_subsets(lengths, n, cap, model, budget=None, max_rows=None, any_size=False,
               at_least_default_rows=False):
    """The same optimum as solve, under the same rules, by dynamic
    programming over the subsets of the sequences (they are few): exact, with
    no solver tolerance, and much faster than the MILP at this size.

    A microbatch is a set of groups whose sizes sum to n: any such multiset
    of powers of two tiles n ranks with aligned blocks (placed largest
    first), as any multiset of sizes tiles them with contiguous ones. Both a
    microbatch's time (the max of its groups') and a plan's (the sum of its
    microbatches') grow with their parts, and so do the CP tokens spent
    against the budget: keeping, per subset, only the parts no other beats on
    both is exact."""
    own, tokens, rows = _instance(lengths, n, cap, max_rows, at_least_default_rows)
    sizes = sorted({size for _, size in blocks(n, any_size)})
    limit = math.inf if budget is None else budget * tokens * (1 + 1e-12)
    everyone = (1 << len(lengths)) - 1

    # groups[c][S]: (per-rank cost, CP tokens spent, per-rank tokens) of a
    # group of c ranks holding the sequences in S; None where a rule forbids it.
    groups = {}
    for c in sizes:
        table = [(0.0, 0.0, 0)] + [None] * everyone
        for subset in range(1, everyone + 1):
            i = (subset & -subset).bit_length() - 1
            rest = table[subset & (subset - 1)]
            size = padded(lengths[i], c)
            if rest is None or c < own[i] or rest[2] + size // c > cap:
                continue
            table[subset] = (rest[0] + cost(model, size, c),
                             rest[1] + size * (c / own[i] - 1), rest[2] + size // c)
        groups[c] = table

    @functools.lru_cache(maxsize=None)
    def tiled(subset, ranks):
        """Ways to split subset into groups on exactly `ranks` ranks."""
        if not subset:
            return [(0.0, 0.0, ())] if ranks == 0 else []
        options = []
        for part in _submasks_with_lowest(subset):
            for c in sizes:
                group = groups[c][part] if c <= ranks else None
                if group is None:
                    continue
                for time, spent, plan in tiled(subset ^ part, ranks - c):
                    options.append((max(group[0], time), group[1] + spent, ((c, part),) + plan))
        return _pareto(options, limit)

    @functools.lru_cache(maxsize=None)
    def planned(subset, microbatches):
        """Ways to split subset into at most `microbatches` microbatches."""
        if not subset:
            return [(0.0, 0.0, ())]
        if microbatches == 0:
            return []
        options = []
        for part in _submasks_with_lowest(subset):
            for time, spent, plan in tiled(part, n):
                for rest_time, rest_spent, rest in planned(subset ^ part, microbatches - 1):
                    options.append((time + model["microbatch"] + rest_time, spent + rest_spent,
                                    (plan,) + rest))
        return _pareto(options, limit)

    best = planned(everyone, rows)
    if not best:
        return None
    plan = []
    for microbatch in best[0][2]:
        used, first = [], 0
        for c, part in sorted(microbatch, key=lambda group: -group[0]):
            used.append((first, c, [s for i, s in enumerate(lengths) if part >> i & 1]))
            first += c
        plan.append(used)
    return step_time(plan, model), plan
