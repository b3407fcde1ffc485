"""Every model family, declared once: what MODELS, a study's FAMILIES and the tools may name.

    from reservoir.models.registry import Family, register

    register(Family(name="leaky_tanh", build=LeakyTanh.build, comment="a leaky-tanh reservoir",
                    settings={"units": (256, "reservoir units"), "learning_rate": (3e-3, "AdamW's rate"), ...},
                    sizes={"xs": {"units": 128}, "s": {"units": 256}, ...}))

A family is a model class built from its settings block (``NAME.units=500`` on the command line), with size
presets for the studies' grids and, where one class makes several families (the transformer in GPT-2's and in
Transformer++'s recipe), the fixed options of each (``variants``). The built-in families are declared in
reservoir/models/__init__.py, their settings blocks written out in reservoir/config.py's SHARED_CONFIG; a
researcher's own come from a file or module named by ``PLUGINS`` (docs/extending.md), whose settings are
declared here with a default and a comment each: reservoir/config.py adds them to SHARED_CONFIG once loaded.

No torch here: reservoir/config.py loads plugins through this module before it validates a command line.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reservoir.platform.messages import OneLineError

LOG, FLOAT, INT = "log", "float", "int"  # how a search space draws a setting (sweep.py)
GRADIENT_SEARCH = {"LEARNING_RATE": (LOG, 1e-4, 1e-2), "WEIGHT_DECAY": (LOG, 1e-4, 0.3)}  # undeclared, fit by steps
FITS = ("sgd", "ridge", "counts")  # gradient steps, a closed-form ridge solve, counting
PRESETS = ("xxs", "xs", "s", "m", "l", "xl")  # every family's size presets, smallest first
ALWAYS_OPTIONAL = ("learning_rate", "batch_size")  # None: the run's LEARNING_RATE / BATCH_SIZE

# What a family leaves untrained: the two classes the word "reservoir" covers, and the rest
RESERVOIR, FROZEN_TRANSITION, TRAINED = "reservoir", "frozen transition", "trained"
CLASSES = {
    RESERVOIR: "a trained readout over fixed, randomly drawn features: reservoir computing's own sense (the ESNs, "
               "NVAR, the linear reservoir, reservoir attention)",
    FROZEN_TRANSITION: "every projection and layer trained, only the recurrence's transition (its decays, angles, "
                       "eigenvalues) left as drawn, as RetNet's decays are (frozen retention, the deep linear "
                       "reservoir)",
    TRAINED: "nothing frozen: the baselines, and the controls that train what a reservoir keeps fixed",
}


class PluginError(OneLineError, ValueError):
    """A plugin that cannot load or declares a family wrongly: reported as one line."""


@dataclass(frozen=True)
class Family:
    """One model family. ``build(vocab_size, block, config)`` returns its LanguageModel from its settings
    block and the run's config (SEED, SEQ_LEN); ``fit`` is one of FITS or a function of the block that names
    one; ``check(block)`` returns a one-line refusal for settings that cannot build together, or None."""

    name: str
    build: Callable
    sizes: dict = field(default_factory=dict)
    settings: dict | None = None  # name -> (default, comment); None: the block is written in SHARED_CONFIG
    comment: str = ""
    variants: dict | None = None  # study family -> the options that make it that family; None: {name: {}}
    fit: object = "sgd"
    check: Callable | None = None
    search: dict | None = None  # sweep.py's search space, {KEY: ('log' | 'float' | 'int', low, high)}; None: the
    # rate and weight decay, for a family fitted by gradient steps
    probe_sizes: list | None = None  # the three settings probes.py trains it at; None: its three smallest presets
    state_size: Callable | None = None  # (model, length) -> the numbers it holds to read on; None: its carried
    # state (initial_state), or a transformer's key-value cache
    added_options: dict | None = None  # options added after runs of it were recorded, each with the value that
    # builds the model as those runs built it (their config.json lacks them)
    flops: dict | None = None  # {aten op name: formula}: the cost of an op it calls that torch's counter counts as
    # 0 (a formula takes the op's arguments, raw tensors, and returns FLOPs; reservoir/run/flops.py's own are alike)
    kind: str | dict = TRAINED  # its class (CLASSES), or {study family: class} where its variants differ
    source: str | None = None  # the plugin it came from; None: built in

    @property
    def block(self) -> str:
        return self.name.upper()

    def study_families(self) -> dict[str, dict]:
        return self.variants if self.variants is not None else {self.name: {}}

    def class_of(self, study_family: str | None = None) -> str:
        """The class (CLASSES) of one of its study families (None: the family's own, as a run of it names it)."""
        if isinstance(self.kind, dict):
            return self.kind.get(study_family or self.name, self.kind.get(self.name, TRAINED))
        return self.kind

    def trainer(self, block: dict) -> str:
        return self.fit(block) if callable(self.fit) else self.fit

    def search_space(self) -> dict | None:
        """What sweep.py searches: the declared space, else the rate and weight decay where gradient steps fit it
        (a closed-form or counted fit declares its own or is not swept)."""
        return dict(self.search) if self.search else dict(GRADIENT_SEARCH) if self.fit == "sgd" else None

    def sizes_to_probe(self) -> list[dict]:
        if self.probe_sizes is not None:
            return list(self.probe_sizes)
        return [self.sizes[p] for p in PRESETS if p in self.sizes][:3]


def presets(keys: tuple[str, ...], **rows: tuple) -> dict[str, dict]:
    """A family's size presets as a table: the settings each column sets, then a row of values per preset
    (``presets(("units", "width"), xs=(128, 48), s=(192, 64))``)."""
    if any(len(row) != len(keys) for row in rows.values()):
        raise PluginError(f"a size preset row gives a value for each of {', '.join(keys)}: got {rows}")
    return {name: dict(zip(keys, row, strict=True)) for name, row in rows.items()}


MODELS: dict[str, Family] = {}  # model name -> its family declaration, in the order declared
STUDY_FAMILIES: dict[str, tuple[str, dict]] = {}  # study family -> (model, the options that make it that family)
PLUGINS: dict[str, str] = {}  # plugin (as named) -> the SHA-256 of its file, for every plugin loaded
_LOADING: list[str] = []  # the plugin being loaded, so a family knows where it came from


def register(family: Family) -> Family:
    """Declare ``family``: a name no other family has, a size preset or more, a default for every setting."""
    where = f"plugin {_LOADING[-1]}: " if _LOADING else ""
    name = family.name
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise PluginError(f"{where}a family's name is a lower-case Python identifier (it becomes MODELS={name} and "
                          f"the settings block {str(name).upper()}), got {name!r}")
    if name in MODELS:
        other = MODELS[name].source or "the built-in families"
        raise PluginError(f"{where}family {name!r} is already declared by {other}: give yours another name")
    clash = [v for v in family.study_families() if v in STUDY_FAMILIES]
    if clash:
        raise PluginError(f"{where}study family {clash[0]!r} of {name!r} is already declared by "
                          f"{MODELS[STUDY_FAMILIES[clash[0]][0]].source or 'the built-in families'}")
    if not family.sizes and family.study_families():  # variants={}: a reference, not a grid family
        raise PluginError(f"{where}family {name!r} declares no size presets: give it sizes={{'xs': {{...}}, 's': "
                          f"{{...}}}} (the settings each preset sets), as the studies' grids need them")
    unknown = [s for s in family.sizes if s not in PRESETS]
    if unknown:
        raise PluginError(f"{where}family {name!r} has a size preset {unknown[0]!r}; presets are {', '.join(PRESETS)}")
    if not callable(family.fit) and family.fit not in FITS:
        raise PluginError(f"{where}family {name!r} has fit={family.fit!r}; one of {', '.join(FITS)}, or a function "
                          "of its settings block that names one")
    if family.settings is not None:
        _check_settings(family, where)
    _check_kind(family, where)
    if family.state_size is not None and not callable(family.state_size):
        raise PluginError(f"{where}family {name!r} has state_size={family.state_size!r}: a function (model, length) "
                          "-> the numbers it holds to read on")
    if _LOADING and family.source is None:
        family = Family(**{**family.__dict__, "source": _LOADING[-1]})
    MODELS[name] = family
    for study_family, options in family.study_families().items():
        STUDY_FAMILIES[study_family] = (name, dict(options))
    return family


def _check_kind(family: Family, where: str) -> None:
    kinds = family.kind if isinstance(family.kind, dict) else {family.name: family.kind}
    named = {family.name, *family.study_families()}
    for study_family, kind in kinds.items():
        if kind not in CLASSES:
            raise PluginError(f"{where}family {family.name!r} has kind={kind!r}; one of "
                              f"{', '.join(map(repr, CLASSES))} ({'; '.join(f'{k}: {v}' for k, v in CLASSES.items())})")
        if study_family not in named:
            raise PluginError(f"{where}family {family.name!r} gives a class to {study_family!r}, which is not one of "
                              f"its study families ({', '.join(sorted(named))})")


def class_of(study_family: str) -> str:
    """The class (CLASSES) of a study family (``frozen_retention+forget``) or a model (``esn``)."""
    model = STUDY_FAMILIES[study_family][0] if study_family in STUDY_FAMILIES else study_family
    return MODELS[model].class_of(study_family)


def family_of(model: str, block: dict, defaults: dict | None = None) -> str:
    """The study family a model built from ``block`` is (``transformer++`` for a transformer in the '++' recipe):
    of the variants whose options the block holds, the one that fixes the most, else the model's own name. With
    the block's ``defaults``, a switch the block turns from its default that the family does not fix is named
    after it: ``reservoir_attention+write reservoir=False`` is the write gate over no reservoir (a control)."""
    family = MODELS.get(model)
    variants = family.study_families() if family else {}
    matching = sorted(((len(options), name) for name, options in variants.items()
                       if all(block.get(k) == v for k, v in options.items())), reverse=True)
    name = model if not matching or (len(matching) > 1 and matching[0][0] == matching[1][0]) else matching[0][1]
    fixed = variants.get(name, {})
    switched = [f"{k}={v}" for k, v in block.items() if isinstance(v, bool) and k not in fixed
                and isinstance((defaults or {}).get(k), bool) and v != defaults[k]]
    return " ".join([name, *switched])


def _check_settings(family: Family, where: str) -> None:
    for setting, declared in family.settings.items():
        if not (isinstance(declared, tuple) and len(declared) == 2 and isinstance(declared[1], str)):
            raise PluginError(f"{where}{family.block}.{setting} is declared as {declared!r}: declare each setting as "
                              f"(default, 'a one-line comment')")
        if declared[0] is None and setting not in ALWAYS_OPTIONAL:
            raise PluginError(f"{where}{family.block}.{setting} has no default: every setting needs one (the run "
                              "that does not name it trains with it)")
    for size, options in family.sizes.items():
        unknown = [k for k in options if k not in family.settings]
        if unknown:
            raise PluginError(f"{where}size preset {size!r} of {family.name!r} sets {unknown[0]!r}, which is not "
                              f"one of its settings ({', '.join(family.settings)})")


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _names_a_file(plugin: str) -> bool:
    return plugin.endswith(".py") or "/" in plugin  # else a module's import path


def plugin_file(plugin: str) -> Path | None:
    """The file a plugin names: a path to a .py file, or a module's file once importable; None if neither."""
    if _names_a_file(plugin):
        path = Path(plugin).expanduser()
        return path if path.is_file() else None
    try:
        spec = importlib.util.find_spec(plugin)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin else None


def load_plugins(plugins) -> dict[str, str]:
    """Import each plugin (a .py file's path, or a module's import path) once; it registers its families.
    Returns {plugin: SHA-256 of its file} for those named."""
    loaded = {}
    for plugin in plugins:
        plugin = str(plugin)
        if plugin not in PLUGINS:
            _import(plugin)
        loaded[plugin] = PLUGINS[plugin]
    return loaded


def _import(plugin: str) -> None:
    path = plugin_file(plugin)
    if path is None:
        raise PluginError(f"PLUGINS names {plugin!r}, which is neither a .py file here nor an importable module: "
                          "give the path of the file that declares your family (PLUGINS=my_models.py)")
    if not path.is_file() or path.suffix != ".py":  # /etc/passwd; a module frozen or built into Python (os, math)
        what = "a module built into Python" if not _names_a_file(plugin) else "not a Python file (.py)"
        raise PluginError(f"PLUGINS names {plugin!r}, {what}: a plugin is the .py file (or a module of your own) "
                          "that declares your family (PLUGINS=my_models.py; docs/extending.md)")
    declared_before = set(MODELS)
    _LOADING.append(plugin)
    try:
        if _names_a_file(plugin):
            spec = importlib.util.spec_from_file_location(f"reservoir_plugin_{path.stem}_{len(PLUGINS)}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
            spec.loader.exec_module(module)
        else:
            importlib.import_module(plugin)
    except PluginError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the plugin's own code raised, said in one line
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        line = f" (line {frames[-1].lineno}: {frames[-1].line.strip()})" if frames else ""
        if isinstance(e, SyntaxError) and e.lineno:
            line = f" (line {e.lineno}: {(e.text or '').strip()})"
        raise PluginError(f"plugin {plugin} failed to load{line}: {type(e).__name__}: {e}") from None
    finally:
        _LOADING.pop()
    if not set(MODELS) - declared_before:
        raise PluginError(f"plugin {plugin} declares no family (it ran, as any import does, and registered none): a "
                          "plugin registers each of its families with register(Family(...)) (docs/extending.md)")
    PLUGINS[plugin] = _file_hash(path)


def changed_plugins(recorded: dict) -> list[str]:
    """Plugins a record names whose file is missing here or whose content has changed since (one line each)."""
    said = []
    for plugin, digest in (recorded or {}).items():
        path = plugin_file(plugin)
        now = None if path is None else _file_hash(path)
        if now is None:
            said.append(f"{plugin} is missing here")
        elif now != digest:
            said.append(f"{plugin} has changed since (SHA-256 {now[:12]}, recorded {digest[:12]})")
    return said
