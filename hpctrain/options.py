"""A command's configuration as one typed dataclass, and its command line generated from it.

Each field is made by :func:`option`: its type (the annotation), default, range or choices,
help, command-line spellings and the environment variable that may set it. From the class,
:func:`add_arguments` generates the argparse options, and a :class:`Parser` (every
``hpctrain`` parser is one) builds the configuration as soon as the command line is parsed,
layered

    the field's default < the command's own default < the environment < a preset
    (``--quick``) < the command line,

and checked field by field (:func:`check_value`) and, in the class's ``__post_init__``, as a
whole. Bad input is one line naming the option and giving an example, and exit status 2 on
every rank (parsing comes before MPI, and every rank parses the same words). The parsed
namespace carries the configuration as ``args.config`` and each field as ``args.<field>``.

``TrainConfig`` (``hpctrain/train/config.py``) is made of the same fields and checks, with
its TOML file and ``--key=value`` overrides between the environment and the command line.
The numbers themselves are read by :mod:`hpctrain.units`.
"""

import argparse
import dataclasses
import math
import os
import textwrap

from . import units
from .errors import UsageError

#: The namespace attribute that names the configuration class of the command parsed.
SPEC = "_options"


def option(default, help, *, flags=(), choices=None, minimum=None, maximum=None, below=None,
           positive=False, flag=None, env=None, metavar=None, parse=None, example=None,
           shown=None, unit=None, off=()):
    """A configuration field. ``help`` may hold ``{default}``, replaced by the default as the
    command line writes it (``shown``, else the value); ``flags``: its spellings (default
    ``--name-with-dashes``); ``minimum``/``maximum``: value >= / <=; ``below``: value <;
    ``positive``: value > 0; ``flag``: the value of a bare option (``True``: an on-switch);
    ``env``: a variable that sets it; ``parse``: text -> value, raising ``ValueError`` that
    says what is wanted (default: by the type); ``example``: a good value for messages;
    ``unit``: what a number counts (``seconds``), for messages; ``off``: the spellings that
    turn an on/off option off (a launcher's ``--no-ft``)."""
    meta = {"help": help, "flags": tuple(flags), "choices": choices, "minimum": minimum,
            "maximum": maximum, "below": below, "positive": positive, "flag": flag,
            "env": env, "metavar": metavar, "parse": parse, "example": example,
            "shown": shown, "unit": unit, "off": tuple(off)}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def spelling(f):
    """The option's long spelling: ``--warmup``."""
    longs = [flag for flag in f.metadata.get("flags", ()) if flag.startswith("--")]
    return (longs or list(f.metadata.get("flags", ())) or
            ["--" + f.name.replace("_", "-")])[0]


def example(f):
    """``--warmup 5``: the option with a good value (its example, else its default)."""
    meta = f.metadata
    value = meta.get("example")
    if value is None:
        default = None if f.default is dataclasses.MISSING else f.default
        value = meta.get("shown") or (default if default not in (None, "") else None)
    if value is None and meta.get("choices"):
        value = meta["choices"][0]
    return f"{spelling(f)} {value}" if value is not None else spelling(f)


def parse_text(f, text, name=None):
    """``text`` as field ``f``'s value; ``None`` (a bare option) is its ``flag``. ``UsageError``
    naming ``name`` (default: the option) and an example otherwise."""
    name = name or spelling(f)
    meta = f.metadata
    if text is None:
        if meta.get("flag") is None:
            raise UsageError(f"{name} needs a value ({meta['help']}); e.g. {example(f)}")
        return meta["flag"]
    try:
        return _parser(f)(text)
    except ValueError as exc:
        raise UsageError(f"{name} {_refusal(f, text, exc)}") from None


def _refusal(f, text, exc):
    # "'x': give a whole number >= 1; e.g. --iters 20": what was wrong with ``text``.
    said = str(exc) or "a valid value"
    said = f"give {said}" if said.startswith(("a ", "an ")) else said
    return f"{text!r}: {said}" + ("" if "e.g." in said else f"; e.g. {example(f)}")


def _parser(f):
    meta = f.metadata
    if meta.get("parse") is not None:
        return meta["parse"]
    if f.type in (int, float):
        return lambda text: units.number(text, f.type, **_bounds(meta), unit=meta.get("unit"))
    if f.type is bool:
        return units.boolean
    return str


def _bounds(meta):
    return {key: meta.get(key) for key in ("minimum", "maximum", "below", "positive")}


def check_value(f, value, name=None):
    """``UsageError`` naming ``name`` (default: the field's name) when ``value`` is not one
    of the field's choices or outside its range; ``None`` (not given) passes."""
    meta, name = f.metadata, f.name if name is None else name
    if value is None:
        return
    if meta.get("choices") and value not in meta["choices"]:
        raise UsageError(f"{name}: {value!r} is not one of "
                         f"{', '.join(map(str, meta['choices']))}")
    if f.type not in (int, float) or isinstance(value, bool):
        return
    # NaN compares false with every bound, and inf passes a lower bound: either would reach
    # the code that uses it and fail there with a traceback.
    bounds = _bounds(meta)
    if f.type is float and not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number{_range(f.type, bounds)}, got {value}")
    for key, broken, words in (("minimum", lambda b: value < b, ">= {}"),
                               ("maximum", lambda b: value > b, "<= {}"),
                               ("below", lambda b: value >= b, "< {}"),
                               ("positive", lambda b: b and not value > 0, "> 0")):
        if bounds[key] not in (None, False) and broken(bounds[key]):
            raise UsageError(f"{name} must be {words.format(bounds[key])}, got {value}")


def _range(kind, bounds):
    # The bounds of a number, as " >= 0.0 and < 1.0"; "" when it has none.
    words = units.wanted(kind, **bounds).split(" ", 2)[-1]
    return f" {words}" if words != "number" else ""


def check(config):
    """Check every field of the dataclass instance ``config`` (its ``__post_init__`` calls
    this), naming each by its option."""
    for f in dataclasses.fields(config):
        try:
            check_value(f, getattr(config, f.name), spelling(f))
        except UsageError as exc:
            raise UsageError(f"{exc}; e.g. {example(f)}") from None


def environment_values(cls, environ):
    """``{field: value}`` for the fields whose variable ``environ`` sets (to a non-empty
    value); ``UsageError`` naming the variable for a bad value."""
    values = {}
    for f in dataclasses.fields(cls):
        variable = f.metadata.get("env")
        text = environ.get(variable) if variable else None
        if not text:
            continue
        try:
            value = parse_text(f, text, variable)
            check_value(f, value)
        except UsageError as exc:
            raise UsageError(f"{variable}={text!r} (the environment): {exc}") from None
        values[f.name] = value
    return values


def checked_value(f, text, name=None):
    """``text`` as field ``f``'s value, parsed and checked; ``UsageError`` naming ``name``
    (default: the option) and an example otherwise."""
    name = name or spelling(f)
    parsed = parse_text(f, text, name)
    try:
        check_value(f, parsed, name)
    except UsageError as exc:
        raise UsageError(f"{exc}; e.g. {example(f)}") from None
    return parsed


def by_flag(cls):
    """``{spelling: field}`` of every field of ``cls`` that has ``flags``: the table of a
    command line that is not argparse's (the launchers', which hand the rest to mpirun)."""
    return {flag: f for f in dataclasses.fields(cls)
            for flag in (*f.metadata.get("flags", ()), *f.metadata.get("off", ()))}


def help_lines(cls, width=92):
    """``--help``'s text for a command line that is not argparse's: one entry per option
    field of ``cls``, its spellings, its value's name and its help."""
    return "".join(_help_line(f, width) for f in dataclasses.fields(cls)
                   if f.metadata.get("flags") or f.metadata.get("off"))


def _help_line(f, width):
    meta = f.metadata
    words = ", ".join((*meta["flags"], *meta["off"]))
    words += f" {meta['metavar']}" if meta["metavar"] else ""
    head, first = ("", f"  {words:<28} ") if len(words) < 29 else (f"  {words}\n", " " * 31)
    text = meta["help"].replace("{default}", str(_shown(f.default)))
    return head + textwrap.fill(text, width=width, initial_indent=first,
                                subsequent_indent=" " * 31, break_on_hyphens=False,
                                break_long_words=False) + "\n"


# --- the command line ---------------------------------------------------------------------

def add_arguments(parser, cls, *, defaults=None, helps=None, skip=()):
    """Add an option to ``parser`` for every field of ``cls`` but ``skip`` (in the argument
    groups of ``cls.GROUPS``, ``{title: (field, ...)}``, where it has them), and make the
    parser build a ``cls`` (:func:`resolve`). ``defaults``: the command's own defaults, as
    the command line would write them (``{"minbytes": "8"}``); ``helps``: the command's own
    help of a field."""
    defaults, helps = dict(defaults or {}), dict(helps or {})
    groups = {}
    for title, names in getattr(cls, "GROUPS", {}).items():
        group = parser.add_argument_group(title)
        groups.update(dict.fromkeys(names, group))
    for f in dataclasses.fields(cls):
        if f.name not in skip:
            groups.get(f.name, parser).add_argument(
                *(f.metadata["flags"] or [spelling(f)]),
                **_argument(f, defaults.get(f.name), helps.get(f.name)))
    parser.set_defaults(**{SPEC: (cls, defaults)})
    if type(parser) is argparse.ArgumentParser:
        parser.__class__ = Parser       # a subparser of a plain parser builds its config too
    return parser


def _argument(f, default_text, help_text):
    meta = f.metadata
    shown = default_text if default_text is not None else \
        meta.get("shown") if meta.get("shown") is not None else _shown(f.default)
    kwargs = {"dest": f.name, "default": argparse.SUPPRESS,
              "help": (help_text or meta["help"]).replace("{default}", str(shown))}
    if meta.get("metavar"):
        kwargs["metavar"] = meta["metavar"]
    if meta.get("flag") is True and f.type is bool:
        return {**kwargs, "action": "store_true"}
    convert = _argparse_type(f)
    if f.type is list:
        return {**kwargs, "action": "append", "type": convert}
    if meta.get("choices"):
        kwargs["choices"] = meta["choices"]
    if meta.get("flag") is not None:
        kwargs.update(nargs="?", const=meta["flag"])
    return {**kwargs, "type": convert}


def _shown(value):
    if isinstance(value, dataclasses._MISSING_TYPE) or value is None:
        return "none"
    return value


def _argparse_type(f):
    # argparse names the option before the message: say what was wrong and a good example.
    def convert(text):
        try:
            value = _parser(f)(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(_refusal(f, text, exc)) from None
        try:
            if f.type is not list:
                check_value(f, value, "")
        except UsageError as exc:
            raise argparse.ArgumentTypeError(f"{str(exc).lstrip(': ')}; e.g. {example(f)}") \
                from None
        return value
    convert.__name__ = f.type.__name__ if isinstance(f.type, type) else "value"
    return convert


def build(cls, given, environ=None, defaults=None):
    """The ``cls`` from its defaults, the command's ``defaults`` (text), ``environ``, the
    class's preset that a given switch asks for (``cls.PRESETS``: ``{switch: {field:
    value}}``) and ``given`` (``{field: value}`` from the command line), in that order."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {name: parse_text(fields[name], text) for name, text in (defaults or {}).items()}
    values.update(environment_values(cls, environ or {}))
    chosen = {**values, **given}
    for switch, preset in getattr(cls, "PRESETS", {}).items():
        if chosen.get(switch):
            values.update(preset)
    values.update(given)
    return cls(**values)


def resolve(namespace, environ=None):
    """Build the configuration that the parsed ``namespace`` names (:func:`add_arguments`):
    ``namespace.config``, each field as an attribute, and ``namespace.given``: the fields
    the command line gave. Nothing when it names none."""
    spec = getattr(namespace, SPEC, None)
    if spec is None:
        return namespace
    cls, defaults = spec
    names = {f.name for f in dataclasses.fields(cls)}
    given = {name: value for name, value in vars(namespace).items() if name in names}
    config = build(cls, given, os.environ if environ is None else environ, defaults)
    delattr(namespace, SPEC)
    namespace.config, namespace.given = config, frozenset(given)
    for name in names:
        setattr(namespace, name, getattr(config, name))
    return namespace


class Parser(argparse.ArgumentParser):
    """An argparse parser that builds the command's configuration once it has parsed it
    (:func:`resolve`), and says what is wrong in one line (exit status 2)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        try:
            resolve(namespace)
        except UsageError as exc:
            self.error(str(exc))
        return namespace, rest

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the "
                     f"options)\n")
