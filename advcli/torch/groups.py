"""The group statistics, one kernel for every entry point: each group's table from its units
(:func:`group_table`), applied to any score of the group (:func:`apply_table`).
:func:`~advcli.torch.compute_advantage` applies it to the units themselves; verl's drop-ins
(:mod:`advcli.torch.drop_in`) to each row's own score, as verl does."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from advcli.settings.config import AdvantageConfig, GigpoNorm, Scale, Singleton
from advcli.settings.rules import (
    PADDED_RETURN,
    RULES,
    SINGLETON_MEAN,
    SINGLETON_STD,
    STD_DDOF,
    WHITEN_EPSILON,
    WHITEN_MIN_TOKENS,
    ZERO_STD,
    Baseline,
    EstimatorRule,
)
from advcli.torch.trajectories import Units


@dataclass(frozen=True)
class GroupCounts:
    groups: int
    singleton_groups: int
    zero_std_groups: int


@dataclass(frozen=True)
class GroupTable:
    """Per group slot, in float64, after the singleton rule: ``count`` (its units),
    ``all_equal`` (every unit carries one score), ``baseline`` (what a score is centred on),
    ``factor`` (what the centred score is multiplied by: rloo's n / (n − 1); None for the
    others), ``divisor`` (what it is divided by, ε included; None when the estimator does not
    divide), ``top`` (pass@k: the order of the group's top unit, the only one whose centred score
    counts; None for the others), ``lone_zero`` (a unit alone in its group gets 0), ``floored``
    (the groups whose units get 0, their std at most ROLL's floor; None: no floor),
    ``others`` (grpo_loo at the group scale: each score is divided by its group's other
    units' std instead of ``divisor``) and ``unit_centred`` (each unit's score less its
    baseline, when that is the mean: kept so the table applied to its own units gathers
    nothing again; None for the others). Slots that no unit uses hold NaN or infinities; they
    are never read.
    """

    count: torch.Tensor
    all_equal: torch.Tensor
    baseline: torch.Tensor
    factor: torch.Tensor | None
    divisor: torch.Tensor | None
    top: torch.Tensor | None
    lone_zero: bool
    unit_centred: torch.Tensor | None
    floored: torch.Tensor | None = None
    others: OthersSpread | None = None

    def counts(self) -> GroupCounts:
        """The groups, those of one unit and those of more whose units carry one score."""
        return GroupCounts(
            groups=int((self.count > 0).sum()),  # group codes may leave gaps
            singleton_groups=int((self.count == 1).sum()),
            zero_std_groups=int((self.all_equal & (self.count > 1)).sum()),
        )


@dataclass(frozen=True)
class OthersSpread:
    """What grpo_loo's divisor (advcli.settings.rules.OTHERS_STD) is made of, per group slot,
    as :func:`advcli.advantages.estimators.others_std` states it: the unit ``count``,
    ``centre`` (the mean), ``m2`` (Σ(x − mean)²), ``all_equal``, the lowest and highest scores,
    how many units carry each, and the Σ of squared deviations of the units above the lowest
    and below the highest; with the std's ``ddof`` and ε."""

    count: torch.Tensor
    centre: torch.Tensor
    m2: torch.Tensor
    all_equal: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    low_count: torch.Tensor
    high_count: torch.Tensor
    m2_above_low: torch.Tensor
    m2_below_high: torch.Tensor
    ddof: int
    epsilon: float

    def divide(self, advantage: torch.Tensor, x: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """``advantage`` (of the scores ``x`` of ``group``) divided by the std of the group's
        other units plus ε, undivided where the others all carry one score (told by the
        counts); a lone unit's by SINGLETON_STD + ε."""

        def of(values: torch.Tensor) -> torch.Tensor:
            return values.index_select(0, group)

        n = of(self.count)
        lowest = (x == of(self.low)) & (of(self.low_count) == 1)
        highest = (x == of(self.high)) & (of(self.high_count) == 1)
        tied = (
            (n <= 2)
            | of(self.all_equal)
            | (lowest & (of(self.high_count) == n - 1))
            | (highest & (of(self.low_count) == n - 1))
        )
        deviation = x - of(self.centre)
        others_m2 = torch.where(
            lowest,
            of(self.m2_above_low),
            torch.where(
                highest, of(self.m2_below_high), of(self.m2) - deviation.square() * n / (n - 1)
            ),
        )
        spread = (others_m2.clamp(min=0.0) / (n - 1 - self.ddof).clamp(min=1.0)).sqrt()
        divided = advantage / spread.masked_fill(n == 1, SINGLETON_STD).add(self.epsilon)
        return torch.where((tied & (n > 1)) | (advantage == 0), advantage, divided)


def _others_spread(
    x: torch.Tensor,
    group: torch.Tensor,
    bound: int,
    parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ddof: int,
    epsilon: float,
) -> OthersSpread:
    """grpo_loo's :class:`OthersSpread` of the units ``x``, from their groups' ``count``,
    ``centre``, ``m2`` and ``all_equal``."""
    count, centre, m2, all_equal = parts
    low = x.new_full((bound,), math.inf).scatter_reduce_(0, group, x, "amin")
    high = x.new_full((bound,), -math.inf).scatter_reduce_(0, group, x, "amax")
    at_low = x == low.index_select(0, group)
    at_high = x == high.index_select(0, group)

    def m2_of(kept: torch.Tensor) -> torch.Tensor:
        """Σ(x − their mean)² of each group's units where ``kept``."""
        weight = kept.to(x.dtype)
        kept_count = x.new_zeros(bound).scatter_add_(0, group, weight)
        mean = x.new_zeros(bound).scatter_add_(0, group, x * weight) / kept_count.clamp(min=1.0)
        deviation = (x - mean.index_select(0, group)) * weight
        return x.new_zeros(bound).scatter_add_(0, group, deviation.square())

    return OthersSpread(
        count=count,
        centre=centre,
        m2=m2.clone(),
        all_equal=all_equal,
        low=low,
        high=high,
        low_count=x.new_zeros(bound).scatter_add_(0, group, at_low.to(x.dtype)),
        high_count=x.new_zeros(bound).scatter_add_(0, group, at_high.to(x.dtype)),
        m2_above_low=m2_of(~at_low),
        m2_below_high=m2_of(~at_high),
        ddof=ddof,
        epsilon=epsilon,
    )


def group_table(  # noqa: PLR0913
    x: torch.Tensor,
    group: torch.Tensor,
    bound: int,
    rule: EstimatorRule,
    scale: Scale,
    singleton: Singleton,
    epsilon: float,
    tokens: torch.Tensor | None = None,
    order: torch.Tensor | None = None,
    members: torch.Tensor | None = None,
    variance_epsilon: float | None = None,
    ddof: int = STD_DDOF,
    std_floor: float | None = None,
) -> GroupTable:
    """The table of the groups of the units ``x`` (``group``: codes in ``[0, bound)``) under
    ``rule``, as :func:`advcli.advantages.estimators.compute_advantages` computes it. ``tokens``:
    each unit's token count (opo's weights); ``order``: each unit's first row (pass@k's tie
    break); ``members``: each group's size (float64) where it has virtual members besides its
    units, each carrying PADDED_RETURN (per-turn rewards' padded step groups; mean-centred
    rules only); ``variance_epsilon``: the std is sqrt(population variance + it) (LightRFT's
    group_norm) where the units differ; ``ddof``: the std's (``--std``); ``std_floor``: a group
    whose std (group scale) is at most it gets 0 (ROLL's normalization)."""
    count, centre, centred, work = group_centred(x, group, bound, members)
    alone = count == 1
    m2 = x.new_zeros(bound).scatter_add_(0, group, torch.mul(centred, centred, out=work))
    if members is not None:
        assert rule.baseline in (Baseline.MEAN, Baseline.LEAVE_ONE_OUT)
        virtual = members - torch.bincount(group, minlength=bound)
        m2.addcmul_(virtual, (centre - PADDED_RETURN).square_())
    all_equal = (m2 == 0).logical_or_(alone)

    top = None
    unit_centred = None
    if rule.baseline is Baseline.TOKEN_WEIGHTED_MEAN:
        assert tokens is not None
        weight = x.new_zeros(bound).scatter_add_(0, group, tokens)
        weighted = x.new_zeros(bound).scatter_add_(0, group, tokens * x)
        baseline = torch.where(all_equal, centre, torch.where(weight > 0, weighted / weight, 0.0))
        baseline.masked_fill_(alone, SINGLETON_MEAN)
    elif rule.baseline is Baseline.SECOND_BEST:
        order = order if order is not None else torch.arange(x.shape[0], device=x.device)
        high = x.new_full((bound,), -math.inf).scatter_reduce_(0, group, x, "amax")
        top = _top_units(x, group, bound, high, order)
        is_top = top.index_select(0, group) == order
        second = x.masked_fill(is_top, -math.inf)
        baseline = x.new_full((bound,), -math.inf).scatter_reduce_(0, group, second, "amax")
        baseline.masked_fill_(alone, SINGLETON_MEAN)
    else:
        baseline, unit_centred = centre, centred
    factor = None
    if rule.baseline is Baseline.LEAVE_ONE_OUT:
        # s minus the mean of the other n - 1 units = n / (n - 1) * (s - mean).
        factor = (count / (count - 1)).masked_fill_(alone, 1.0)

    divisor = floored = others = None
    if rule.others_std and scale is Scale.GROUP:
        others = _others_spread(x, group, bound, (count, centre, m2, all_equal), ddof, epsilon)
    elif scale is Scale.GROUP:
        # A lone unit is divided by the singleton std (its own is never read, so no 0 / 0 is
        # taken for it); equal units by the zero std.
        if variance_epsilon is None:
            variance = m2.div_((count - ddof).clamp_(min=1))
        else:
            variance = m2.div_(count).add_(variance_epsilon)
        std = variance.sqrt_().masked_fill_(all_equal, ZERO_STD).masked_fill_(alone, SINGLETON_STD)
        if std_floor is not None:
            floored = std <= std_floor
        divisor = std.add_(epsilon)
    elif scale is Scale.BATCH:
        # Every unit divided by the batch std; one alone in its group by the singleton std
        # when the batch std is 0 (advcli.settings.rules).
        batch = _batch_std(x, ddof)
        lone = batch if batch != ZERO_STD else SINGLETON_STD
        divisor = torch.full_like(count, batch).masked_fill_(alone, lone).add_(epsilon)
    return GroupTable(
        count=count,
        all_equal=all_equal,
        baseline=baseline,
        factor=factor,
        divisor=divisor,
        top=top,
        lone_zero=singleton is Singleton.ZERO or not rule.singleton_keeps_score,
        unit_centred=unit_centred,
        floored=floored,
        others=others,
    )


def group_centred(
    x: torch.Tensor, group: torch.Tensor, bound: int, members: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each group's unit ``count`` (float64; ``members`` where given, virtual members
    included) and ``centre`` (its mean after the singleton rule), each unit's score less its
    group's centre, and a spare per-unit buffer."""
    real = torch.bincount(group, minlength=bound).to(torch.float64)
    count = real if members is None else members
    # The mean from values shifted by one of the group's own (any one: a scatter, cheaper than
    # a group maximum): equal units give their score exactly, and Σ(x − mean)² exactly 0, which
    # tells them (a group whose units differ has a unit off its mean).
    representative = x.new_zeros(bound).scatter_(0, group, x)
    # Two per-unit buffers for every intermediate, and per-group ones updated in place: fresh
    # large allocations cost page faults.
    work = representative.index_select(0, group)
    torch.sub(x, work, out=work)
    shifted = x.new_zeros(bound).scatter_add_(0, group, work)
    if members is not None:
        # Each virtual member is PADDED_RETURN − representative off it: a group of real zeros
        # and virtual ones keeps the mean 0 exactly.
        shifted.addcmul_(count - real, PADDED_RETURN - representative)
    mean = shifted.div_(count).add_(representative)
    # Centred on the mean after the singleton rule: a lone unit's Σ(x − mean)² is never read, and
    # the centred scores are the advantages' numerators when the baseline is the mean.
    centre = mean.masked_fill_(count == 1, SINGLETON_MEAN)
    centred = centre.index_select(0, group)
    torch.sub(x, centred, out=centred)
    return count, centre, centred, work


def apply_table(
    table: GroupTable, x: torch.Tensor, group: torch.Tensor, order: torch.Tensor | None = None
) -> torch.Tensor:
    """The advantage of each score ``x`` of group ``group`` under the groups' ``table``;
    ``order`` (each score's unit's first row) picks pass@k's top unit."""
    # Each intermediate written into a buffer of its own gather: fresh large allocations cost
    # page faults.
    centred = table.baseline.index_select(0, group)
    torch.sub(x, centred, out=centred)
    return _advantage_of_centred(table, centred, x, group, order)


def apply_table_to_units(
    table: GroupTable, x: torch.Tensor, group: torch.Tensor, order: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`apply_table` to the units the table was made from (``x``, ``group``), reusing their
    centred scores where the table kept them."""
    if table.unit_centred is None:
        return apply_table(table, x, group, order)
    return _advantage_of_centred(table, table.unit_centred, x, group, order)


def _advantage_of_centred(
    table: GroupTable,
    centred: torch.Tensor,
    x: torch.Tensor,
    group: torch.Tensor,
    order: torch.Tensor | None,
) -> torch.Tensor:
    """The advantage of each score ``x``, from its ``centred`` score (it less its group's
    baseline)."""
    if table.top is not None:
        assert order is not None
        centred = torch.where(order == table.top.index_select(0, group), centred, 0.0)
    if table.factor is not None:
        centred = centred * table.factor.index_select(0, group)
    if table.others is not None:
        advantage = table.others.divide(centred, x, group)
    elif table.divisor is not None:
        divisor = table.divisor.index_select(0, group)
        advantage = torch.div(centred, divisor, out=divisor)
        if bool((table.divisor == 0).any()):
            # A centred score of exactly 0 (a zero-std group's) stays exactly 0, also with
            # ε = 0, where 0 / 0 would be NaN; over a divisor above 0 it is 0 already.
            advantage = torch.where(centred == 0, 0.0, advantage)
    else:
        advantage = centred
    if table.lone_zero:
        advantage = torch.where(table.count.index_select(0, group) == 1, 0.0, advantage)
    if table.floored is not None:
        advantage = torch.where(table.floored.index_select(0, group), 0.0, advantage)
    return advantage


def unit_advantages(units: Units, config: AdvantageConfig) -> tuple[torch.Tensor, GroupCounts]:
    """Each unit's advantage under its estimator's rule (advcli.settings.rules), and its groups'
    counts."""
    order = units.first_row
    if order is None:
        order = torch.arange(units.score.shape[0], device=units.score.device)
    table = group_table(
        units.score,
        units.group,
        units.groups,
        RULES[config.estimator],
        config.effective_scale,
        config.singleton,
        config.epsilon,
        units.tokens,
        order,
        ddof=config.std_ddof,
        std_floor=config.step.std_floor if config.step is not None else None,
    )
    if config.step is not None:
        table = gigpo_divisor(table, config)
    return apply_table_to_units(table, units.score, units.group, order), table.counts()


def gigpo_divisor(table: GroupTable, config: AdvantageConfig) -> GroupTable:
    """The table with GiGPO's episode divisor (``config.step.norm``): 1 + ε for every group
    under ``mean``, the std + ε under ``mean_std``."""
    assert config.step is not None and table.divisor is not None
    if config.step.norm is GigpoNorm.MEAN:
        return replace(table, divisor=torch.full_like(table.count, SINGLETON_STD + config.epsilon))
    return table


def own_score_divisor(table: GroupTable, config: AdvantageConfig) -> GroupTable:
    """The table under ``--traj-score own``, each row centred on its own score: a group whose
    counted rows tie is divided by SINGLETON_STD + ε, never by ε alone (a penalized row's −0.1
    would become −1e5)."""
    if table.divisor is None:
        return table
    tied = table.divisor.masked_fill(table.all_equal, SINGLETON_STD + config.epsilon)
    return replace(table, divisor=tied)


def _top_units(
    x: torch.Tensor, group: torch.Tensor, bound: int, high: torch.Tensor, order: torch.Tensor
) -> torch.Tensor:
    """Each group's top unit, by ``order``: the first (its first row) with the group's highest
    score."""
    at_top = x == high.index_select(0, group)
    first = torch.full((bound,), torch.iinfo(torch.int64).max, device=x.device)
    return first.scatter_reduce_(0, group[at_top], order[at_top], "amin")


def _batch_std(x: torch.Tensor, ddof: int) -> float:
    """The std of every unit's score in the batch (advcli.settings.rules: --scale batch)."""
    if x.numel() == 1:
        return SINGLETON_STD
    if bool(x.min() == x.max()):
        return ZERO_STD
    return float(x.std(correction=ddof))


def whiten(values: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """REINFORCE++'s whitening over every response token: each row counts its tokens' times;
    a row without tokens gets 0 (verl multiplies by the mask). An empty batch has nothing to
    whiten: its empty result, as every estimator's."""
    if not values.numel():
        return values
    total = float(tokens.sum())
    if total < WHITEN_MIN_TOKENS:
        raise ValueError(
            "reinforce_pp_baseline whitens over response tokens and needs at least "
            f"{WHITEN_MIN_TOKENS}; the batch has {total:g}"
        )
    mean = float((tokens * values).sum()) / total
    variance = float((tokens * (values - mean) ** 2).sum()) / (total - 1)
    whitened = (values - mean) / math.sqrt(variance + WHITEN_EPSILON)
    return torch.where(tokens > 0, whitened, 0.0)
