"""The component registry: one :class:`Component` record per modelled engine component.

Every command — check, fuzz, replay, explore, mutants, verify, bench — reads a component from
here, and nothing outside this module names a component. A record says where the spec and the impl
live, the target API they share (the loader's exit-2 message), the named variants (passed
everywhere as ``variant=``, the default first), the lockstep checker (driver, operations table,
facts, invariants: a :class:`~stateful_tests.checker.CheckerDef`), the explorer model and its
bounds, the bench suites, the planted bugs, and the extra stages ``kvspec verify`` runs.

Heavy parts are named as ``"module:attribute"`` references and imported on first use, so that
``kvspec --help`` or a failing argument check does not import hypothesis, z3 or torch; a record
built in code (a test's toy component) may hold the objects themselves. Adding a component is one
record plus its spec, impl and driver: docs/adding-a-component.md walks through it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from spec.infinilm.scheduler import RESERVATIONS
from spec.vllm.kv_cache_manager import VARIANTS as PREFIX_CACHE_VARIANTS
from spec.vllm.offload_manager import VARIANTS as OFFLOAD_VARIANTS

if TYPE_CHECKING:  # the checkers import hypothesis: only when a command runs one
    from stateful_tests.checker import CheckerDef, Example, Mutant, Options, Reference
    from stateful_tests.lockstep import RunResult

Ref = Any
"""An object, or the ``"module:attribute"`` text naming it."""


def resolve(ref: Ref) -> Any:
    """The object ``ref`` names (``ref`` itself if it is not a ``"module:attribute"`` text)."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    value: Any = importlib.import_module(module)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def _accepts(cls: Any, keyword: str) -> bool:
    """Whether constructing ``cls`` takes ``keyword`` (or any keyword); unknown: assume so."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == keyword or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class ComponentError(ValueError):
    """A component, variant or option that does not exist (the CLI exits 2 with the message)."""


@dataclass(frozen=True)
class VerifyPlan:
    """What ``kvspec verify`` runs of one component: hypothesis programs per variant (``None``:
    the ``ci`` profile's own count), fuzzed calls per variant (quick, full), and extra stages
    ``(name, "module:function")``, each function ``(component, quick) -> (status, summary)``."""

    check_examples: int | None = None
    fuzz_ops: tuple[int, int] = (5_000, 30_000)
    stages: tuple[tuple[str, Ref], ...] = ()


@dataclass(frozen=True)
class ExplorerPlan:
    """The exhaustive explorer's view of a component: the model class (``proofs.explorer.Model``
    subclass, built as ``model(component, target_cls, target, bounds)``), its bounds class (a
    frozen dataclass; a ``variant`` field takes the component's variants) and the small scope that
    ``kvspec verify`` explores completely (bound overrides)."""

    model: Ref
    bounds: Ref
    verify_scope: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Component:
    """One modelled component and everything the commands need to check it."""

    name: str
    summary: str
    spec: str  # "module:Class" of the executable spec
    impl: str  # "module:Class" of the production implementation
    required_api: tuple[str, ...]
    checker: Ref  # a CheckerDef
    variants: tuple[str, ...] = ()  # named variants, the default first; () = none
    # the constructor keyword that selects a non-default variant: a target without it (upstream's
    # own class) implements the default variant only, which is then checked instead of drawing
    variant_keyword: str | None = None
    fixed_options: Mapping[str, Any] = field(default_factory=dict)  # given to every checker run
    flags: Mapping[str, str] = field(default_factory=dict)  # boolean checker options: name -> help
    settings: Mapping[str, str] = field(
        default_factory=dict
    )  # valued checker options: name -> help
    targets: Mapping[str, str] = field(default_factory=dict)  # extra built-in target names
    mutants: Ref = ()  # a sequence of stateful_tests.checker.Mutant
    equivalent_mutants: Ref = ()  # planted changes proved not to be bugs (must survive)
    explorer: ExplorerPlan | None = None
    bench_suites: tuple[str, ...] = ()
    verify: VerifyPlan = field(default_factory=VerifyPlan)

    # ------------------------------------------------------------------ parts, resolved once
    @cached_property
    def checker_def(self) -> CheckerDef:
        checker: CheckerDef = resolve(self.checker)
        return checker

    @cached_property
    def planted(self) -> tuple[Mutant, ...]:
        """The planted bugs, each tagged with this component."""
        return tuple(replace(m, component=self.name) for m in resolve(self.mutants))

    @cached_property
    def equivalent(self) -> tuple[Mutant, ...]:
        return tuple(replace(m, component=self.name) for m in resolve(self.equivalent_mutants))

    @property
    def engine(self) -> str | None:
        """The engine whose code this component models (``vllm``, ``sglang``, ``infinilm``): the
        engine of a bare source (``git:REPO@REV``, a wheel, a tree) given as ``--target``."""
        from kvspec.engines.trees import ENGINES

        return next((name for name in self.targets if name in ENGINES), None)

    def builtin_targets(self) -> dict[str, str]:
        """Short target names -> ``"module:Class"``: ``impl``, ``spec`` and the extra ones."""
        return {"impl": self.impl, "spec": self.spec, **self.targets}

    # ------------------------------------------------------------------ arguments
    def check_variant(self, variant: str | None) -> str | None:
        """``variant`` if it names one of this component's variants (``None``: drawn per run)."""
        if variant is None:
            return None
        if not self.variants:
            raise ComponentError(f"--variant does not apply to {self.name} (it has no variants)")
        if variant not in self.variants:
            raise ComponentError(
                f"unknown {self.name} variant {variant!r}; choose one of {', '.join(self.variants)}"
            )
        return variant

    def target_variant(self, variant: str | None, target_cls: Any) -> str | None:
        """``variant``, else the one the target says it implements (``kvspec_variant``, e.g. the
        installed vLLM release behind ``--target vllm``), else ``None`` (drawn per run)."""
        if variant is not None:
            return self.check_variant(variant)
        own = getattr(target_cls, "kvspec_variant", None)
        if isinstance(own, str) and self.variants:
            return self.check_variant(own)
        if (
            self.variants
            and self.variant_keyword
            and not _accepts(target_cls, self.variant_keyword)
        ):
            return self.variants[0]
        return None

    def target_variants(self, target_cls: Any) -> tuple[str, ...]:
        """The variants a run with none named covers: those the target says it can be
        (``kvspec_variants``, e.g. SGLang's ``RadixCache`` is no ``unified-*`` one), else all."""
        own = getattr(target_cls, "kvspec_variants", None)
        if own is None:
            return self.variants
        return tuple(v for v in self.variants if v in own)

    def options(self, **given: Any) -> dict[str, Any]:
        """The checker options of a run: the fixed ones, then those ``given`` that are not ``None``
        (each must be one the checker takes)."""
        chosen = {k: v for k, v in given.items() if v is not None}
        unknown = sorted(set(chosen) - set(self.checker_def.options))
        if unknown:
            raise ComponentError(f"{', '.join(unknown)} does not apply to {self.name}")
        return {**self.fixed_options, **chosen}

    # ------------------------------------------------------------------ checker runs
    def check(
        self,
        target_cls: Callable[..., Any],
        target: str,
        settings: Any,
        *,
        variant: str | None = None,
        inputs: str = "all",
        timeout: float | None = 10.0,
        reference: Reference | None = None,
        **options: Any,
    ) -> RunResult:
        """The hypothesis lockstep machine (and the explicit programs) under ``settings``;
        ``reference``: what the target is compared with (default: the spec)."""
        from stateful_tests import checker

        return checker.check(
            self.name,
            self.checker_def,
            target_cls,
            target,
            settings,
            variant=self.check_variant(variant),
            options=self.options(**options),
            timeout=timeout,
            inputs=inputs,
            variants=self.target_variants(target_cls),
            reference=reference or checker.SPEC,
        )

    def fuzz(
        self,
        target_cls: Callable[..., Any],
        target: str,
        ops: int,
        seed: int,
        *,
        variant: str | None = None,
        progress: Callable[[int], None] | None = None,
        episode_ops: int | None = None,
        inputs: str = "all",
        timeout: float | None = 10.0,
        rows: Collection[str] | None = None,
        reference: Reference | None = None,
        **options: Any,
    ) -> RunResult:
        """Seeded differential fuzzing until ``ops`` lockstep calls."""
        from stateful_tests import checker

        return checker.fuzz(
            self.name,
            self.checker_def,
            target_cls,
            target,
            ops,
            seed,
            variant=self.check_variant(variant),
            options=self.options(**options),
            timeout=timeout,
            rows=rows,
            inputs=inputs,
            episode_ops=episode_ops,
            progress=progress,
            reference=reference or checker.SPEC,
        )

    def replay(
        self,
        document: Mapping[str, Any],
        target_cls: Callable[..., Any],
        target: str,
        *,
        inputs: str | None = None,
        timeout: float | None = 10.0,
        reference: Reference | None = None,
        **options: Any,
    ) -> RunResult:
        """Re-run a saved trace on a fresh reference (the spec by default) and ``target``
        (``inputs``: the trace's own unless given; ``well-formed`` leaves its bad-input calls
        out)."""
        from stateful_tests import checker

        return checker.replay(
            self.name,
            self.checker_def,
            document,
            target_cls,
            target,
            options=self.options(**options),
            timeout=timeout,
            inputs=inputs,
            reference=reference or checker.SPEC,
        )

    def shrink(
        self,
        document: dict[str, Any],
        target_cls: Callable[..., Any],
        target: str,
        *,
        budget_seconds: float = 10.0,
        same_operation: bool = False,
        reference: Reference | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Delta-debug a failing trace for at most ``budget_seconds``, keeping its check and the
        input class of its failing call (with ``same_operation``, also that call's operation)."""
        from stateful_tests import checker

        return checker.shrink(
            self.name,
            self.checker_def,
            document,
            target_cls,
            target,
            budget_seconds=budget_seconds,
            options=self.options(**options),
            same_operation=same_operation,
            reference=reference or checker.SPEC,
        )

    def run_example(
        self,
        target_cls: Callable[..., Any],
        target: str,
        example: Example,
        *,
        variant: str | None = None,
        inputs: str = "all",
        timeout: float | None = 10.0,
        reference: Reference | None = None,
        **options: Any,
    ) -> RunResult:
        """One explicit program (a seeded, scripted run on a chosen configuration)."""
        from stateful_tests import checker

        return checker.run_example(
            self.name,
            self.checker_def,
            target_cls,
            target,
            example,
            variant=self.check_variant(variant),
            options=self.options(**options),
            timeout=timeout,
            inputs=inputs,
            reference=reference or checker.SPEC,
        )

    def mutant_options(self, m: Mutant) -> dict[str, Any]:
        """The keywords of :meth:`check`/:meth:`fuzz` that put mutant ``m`` in reach."""
        return {"variant": m.variant, **m.options}


# ============================================================================ the records
_INFINILM_BM_API = (
    "allocate_slots",
    "get_computed_blocks",
    "append_slot",
    "append_slots",
    "truncate_blocks",
    "publish_computed_blocks",
    "free_blocks",
    "try_free_blocks",
    "can_allocate",
    "get_num_free_blocks",
    "get_total_usable_blocks",
    "update_blocks_slot",
)
_INFINILM_SCHEDULER_API = (
    "add_request",
    "schedule",
    "can_accept_request",
    "complete_requests",
    "commit_computed_tokens",
    "update_from_output",
    "update_waiting_for_remote_kv",
    "get_cache_stats",
)
_VLLM_OFFLOAD_API = (
    "lookup",
    "prepare_load",
    "complete_load",
    "prepare_store",
    "complete_store",
    "touch",
    "reset_cache",
    "take_events",
)
_VLLM_PREFIX_CACHE_API = (
    "get_computed_blocks",
    "allocate_slots",
    "free",
    "pop_blocks_for_free",
    "evict_blocks",
    "reset_prefix_cache",  # (get_num_common_prefix_blocks: gone in 0.34, called where it exists)
    "take_events",
    "create_kv_cache_blocks",
)
_SGLANG_RADIX_API = (
    "match_prefix",
    "insert",
    "evict",
    "inc_lock_ref",
    "dec_lock_ref",
    "evictable_size",
    "protected_size",
    "node_path",
)
_VLLM_ADAPTER = "kvspec.engines.vllm.vllm_adapter:VllmCPUOffloadingManager"
_OFFLOAD_EXPLORER = ("proofs.explorer:OffloadModel", "proofs.explorer:OffloadBounds")

_BUILTIN: tuple[Component, ...] = (
    Component(
        name="infinilm-block-manager",
        summary="InfiniLM's paged BlockManager with its prefix cache (docs/infinilm.md §1-§4)",
        spec="spec.infinilm.block_manager:BlockManager",
        impl="impl.infinilm.block_manager:BlockManager",
        required_api=_INFINILM_BM_API,
        checker="stateful_tests.infinilm_block_manager:CHECKER",
        targets={"infinilm": "infinilm.llm.cache_manager:BlockManager"},
        mutants="stateful_tests.mutants_infinilm:BLOCK_MANAGER_MUTANTS",
        explorer=ExplorerPlan(
            "proofs.explorer:BlockManagerModel",
            "proofs.explorer:BlockManagerBounds",
            {"pages": 2, "vocab": 2, "tables": 1, "tokens": 2},
        ),
        bench_suites=("reclaim", "usable"),
        verify=VerifyPlan(check_examples=None, fuzz_ops=(50_000, 300_000)),
    ),
    Component(
        name="infinilm-scheduler",
        summary="InfiniLM's Scheduler over the block manager, reservation variants "
        "(docs/infinilm.md §5-§7)",
        spec="spec.infinilm.scheduler:Scheduler",
        impl="impl.infinilm.scheduler:Scheduler",
        required_api=_INFINILM_SCHEDULER_API,
        checker="stateful_tests.infinilm_scheduler:CHECKER",
        variants=RESERVATIONS,
        variant_keyword="reservation",
        flags={
            "soundness": "also fail when a decode step runs out of pages without draft tokens "
            "(admission_soundness)"
        },
        settings={
            "request_module": "the module holding the target's InferenceRequest and "
            "RequestStatus (default: the target's own module)"
        },
        targets={"infinilm": "infinilm.llm.scheduler:Scheduler"},
        mutants="stateful_tests.mutants_infinilm:SCHEDULER_MUTANTS",
        explorer=ExplorerPlan(
            "proofs.explorer:SchedulerModel",
            "proofs.explorer:SchedulerBounds",
            {"pages": 3, "requests": 2, "prompt_tokens": 2, "max_new": 2},
        ),
        bench_suites=("schedule", "capacity", "admission"),
        verify=VerifyPlan(
            check_examples=60,
            fuzz_ops=(5_000, 30_000),
            stages=(
                ("admission soundness (spec)", "kvspec.admission:soundness_stage"),
                ("admission predictor (example manifest)", "kvspec.admission:predictor_stage"),
            ),
        ),
    ),
    Component(
        name="vllm-arc",
        summary="vLLM's CPU offload manager with the ARC policy (docs/vllm.md §1-§2)",
        spec="spec.vllm.offload_manager:CPUOffloadingManager",
        impl="impl.vllm.offload_manager:CPUOffloadingManager",
        required_api=_VLLM_OFFLOAD_API,
        checker="stateful_tests.vllm_offload:CHECKER",
        variants=OFFLOAD_VARIANTS["arc"],
        variant_keyword="arc_t1_fallback",
        fixed_options={"policy": "arc"},
        targets={"vllm": _VLLM_ADAPTER},
        mutants="stateful_tests.mutants_vllm:ARC_MUTANTS",
        equivalent_mutants="stateful_tests.mutants_vllm:ARC_EQUIVALENT_MUTANTS",
        explorer=ExplorerPlan(*_OFFLOAD_EXPLORER, {"capacity": 2, "keys": 3}),
        bench_suites=("arc",),
        verify=VerifyPlan(check_examples=60, fuzz_ops=(5_000, 30_000)),
    ),
    Component(
        name="vllm-lru",
        summary="vLLM's CPU offload manager with the LRU policy (docs/vllm.md §1, §3)",
        spec="spec.vllm.offload_manager:CPUOffloadingManager",
        impl="impl.vllm.offload_manager:CPUOffloadingManager",
        required_api=_VLLM_OFFLOAD_API,
        checker="stateful_tests.vllm_offload:CHECKER",
        variants=OFFLOAD_VARIANTS["lru"],
        variant_keyword="lru",
        fixed_options={"policy": "lru"},
        targets={"vllm": _VLLM_ADAPTER},
        mutants="stateful_tests.mutants_vllm:LRU_MUTANTS",
        explorer=ExplorerPlan(*_OFFLOAD_EXPLORER, {"capacity": 2, "keys": 3}),
        bench_suites=("lru",),
        verify=VerifyPlan(check_examples=60, fuzz_ops=(5_000, 30_000)),
    ),
    Component(
        name="vllm-prefix-cache",
        summary="vLLM v1's GPU prefix cache, BlockPool + KVCacheManager with one full-attention "
        "group (docs/vllm.md §5, docs/vllm-kv-cache-manager.md)",
        spec="spec.vllm.kv_cache_manager:KVCacheManager",
        impl="impl.vllm.kv_cache_manager:KVCacheManager",
        required_api=_VLLM_PREFIX_CACHE_API,
        checker="stateful_tests.vllm_prefix_cache:CHECKER",
        variants=PREFIX_CACHE_VARIANTS,
        variant_keyword="free_order",
        targets={"vllm": "kvspec.engines.vllm.vllm_prefix_adapter:VllmKVCacheManager"},
        mutants="stateful_tests.mutants_vllm_prefix:PREFIX_CACHE_MUTANTS",
        explorer=ExplorerPlan(
            "proofs.explorer:PrefixCacheModel",
            "proofs.explorer:PrefixCacheBounds",
            {"requests": 1},
        ),
        bench_suites=("prefix-cache",),
        verify=VerifyPlan(check_examples=25, fuzz_ops=(2_000, 20_000)),  # x 8 variants
    ),
    Component(
        name="sglang-radix-cache",
        summary="SGLang's RadixCache with its token/paged KV-slot allocators, driven as its "
        "scheduler drives them (docs/sglang.md)",
        spec="spec.sglang.radix_cache:RadixCache",
        impl="impl.sglang.radix_cache:RadixCache",
        required_api=_SGLANG_RADIX_API,
        checker="stateful_tests.sglang_radix_cache:CHECKER",
        variants=("lru", "fifo", "mru", "unified-lru", "unified-fifo", "unified-mru"),
        variant_keyword="eviction_policy",
        targets={
            "sglang": "kvspec.engines.sglang.sglang_adapter:SglangRadixCache",
            "sglang-unified": "kvspec.engines.sglang.sglang_adapter:SglangUnifiedRadixCache",
            "sglang-unified-rust": "kvspec.engines.sglang.sglang_adapter:SglangUnifiedRustRadixCache",
        },
        mutants="stateful_tests.mutants_sglang:RADIX_CACHE_MUTANTS",
        explorer=ExplorerPlan(
            "proofs.explorer:RadixCacheModel",
            "proofs.explorer:RadixCacheBounds",
            {"requests": 1, "pages": 2},
        ),
        bench_suites=("radix",),
        verify=VerifyPlan(check_examples=25, fuzz_ops=(3_000, 20_000)),  # x 3 variants
    ),
)

_REGISTRY: dict[str, Component] = {c.name: c for c in _BUILTIN}


# ============================================================================ lookups
def names() -> tuple[str, ...]:
    """Registered component names, in registration order."""
    return tuple(_REGISTRY)


def all_components() -> tuple[Component, ...]:
    return tuple(_REGISTRY.values())


def get(name: str) -> Component:
    """The component ``name`` (``ComponentError`` naming the known ones otherwise)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ComponentError(
            f"unknown component {name!r} (available: {', '.join(_REGISTRY)})"
        ) from None


def register(component: Component) -> None:
    """Add a component (``ComponentError`` if the name is taken)."""
    if component.name in _REGISTRY:
        raise ComponentError(f"component {component.name!r} is already registered")
    _REGISTRY[component.name] = component


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


@contextmanager
def registered(component: Component) -> Iterator[Component]:
    """``component`` registered for the duration of a ``with`` block."""
    register(component)
    try:
        yield component
    finally:
        unregister(component.name)


def catalogue() -> dict[str, Mutant]:
    """Every planted bug of every component, by name, in registration order."""
    return {m.name: m for c in _REGISTRY.values() for m in c.planted}


def equivalent_mutants() -> dict[str, Mutant]:
    return {m.name: m for c in _REGISTRY.values() for m in c.equivalent}


def bench_suites() -> dict[str, Component]:
    """Bench suite name -> the component it measures."""
    return {suite: c for c in _REGISTRY.values() for suite in c.bench_suites}


def with_flag(flag: str) -> tuple[str, ...]:
    """The components that take the boolean checker option ``flag``."""
    return tuple(c.name for c in _REGISTRY.values() if flag in c.flags)


def all_flags() -> dict[str, str]:
    """Every boolean checker option any component takes -> its help text."""
    flags: dict[str, str] = {}
    for c in _REGISTRY.values():
        for flag, text in c.flags.items():
            flags.setdefault(flag, text)
    return flags


def describe_variants() -> str:
    """``name: a, b; …`` for the components that have variants (CLI help)."""
    return "; ".join(f"{c.name}: {', '.join(c.variants)}" for c in _REGISTRY.values() if c.variants)


def all_settings() -> dict[str, str]:
    """Every valued checker option any component takes -> its help text."""
    settings: dict[str, str] = {}
    for c in _REGISTRY.values():
        for name, text in c.settings.items():
            settings.setdefault(name, text)
    return settings


def options_of(component: Component, values: Mapping[str, Any]) -> Options:
    """The flags and settings among ``values`` (e.g. parsed CLI arguments) that ``component``
    takes; one given for a component without it is a ``ComponentError``."""
    chosen: dict[str, Any] = {}
    for name in (*all_flags(), *all_settings()):
        value = values.get(name)
        if value is None or value is False:
            continue
        if name not in component.flags and name not in component.settings:
            owners = ", ".join(
                c.name for c in _REGISTRY.values() if name in c.flags or name in c.settings
            )
            raise ComponentError(
                f"--{name.replace('_', '-')} applies to {owners}, not {component.name}"
            )
        chosen[name] = value
    return chosen
