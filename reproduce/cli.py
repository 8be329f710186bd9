"""The command line around Hydra, shared by the entry points: ``--help`` pages (``conf/hydra/help/<app>.yaml``, their
config-group lists made by :func:`config_groups_help`) and ``--cfg job`` printing the config a run trains
(:func:`show_resolved_cfg`, resolved as ``repdegen.reproduce.describe`` resolves it), not Hydra's first composition."""

from __future__ import annotations

import sys
import textwrap

from omegaconf import OmegaConf
from repdegen.reproduce.settings.config import CONF_DIR, register_all
from repdegen.reproduce.settings.resolve import resolve

HELP_FLAGS = ("--help", "-h")
# ConfigStore entries that are schemas (the YAML options extend them), not options a user picks
HELP_HIDDEN_PREFIXES = ("schema_", "base_")


def config_groups_help(*groups: str) -> str:
    """The config groups a user picks from, one ``group: option, ...`` line each (wrapped), as Hydra finds them (its
    search path: ``conf/`` and any ``hydra.searchpath``), for the help pages ``conf/hydra/help/*.yaml``:
    ``${repdegen_config_groups:table,scale}`` those groups, ``${repdegen_config_groups:-table}`` every group but those.
    Hydra's own groups and the ConfigStore's schemas (``schema_*``, ``base_*``) are left out; a nested group is listed
    under its parent (``experiment: inan2017/small, ...``, as ``experiment=inan2017/small`` picks it)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    if not GlobalHydra.instance().is_initialized():  # called outside an app
        from hydra import initialize_config_dir

        register_all()
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return config_groups_help(*groups)
    loader = GlobalHydra.instance().config_loader()

    def options(group: str, prefix: str = "") -> list[str]:
        found = [prefix + o for o in loader.get_group_options(group, ObjectType.CONFIG)
                 if not o.startswith(HELP_HIDDEN_PREFIXES)]
        for sub in loader.get_group_options(group, ObjectType.GROUP):
            found += options(f"{group}/{sub}", f"{prefix}{sub}/")
        return found

    only = [g for g in groups if not g.startswith("-")]
    skip = {"hydra", *(g[1:] for g in groups if g.startswith("-"))}
    rows = [(g, sorted(options(g))) for g in (only or sorted(loader.list_groups(""))) if g not in skip]
    rows = [(g, o) for g, o in rows if o]
    width = max((len(g) for g, _ in rows), default=0) + 3
    return "\n".join(textwrap.fill(", ".join(o), width=118, initial_indent=f"  {g + ':':<{width}}",
                                   subsequent_indent=" " * (width + 2), break_on_hyphens=False) for g, o in rows)


def use_app_help(app: str, argv: list[str] | None = None) -> None:
    """``--help`` / ``-h`` shows ``conf/hydra/help/<app>.yaml`` (Hydra's help, through its ``hydra/help`` config group:
    the option is added to the command line, which is what a help page composes; nothing else reads it)."""
    argv = sys.argv if argv is None else argv
    OmegaConf.register_new_resolver("repdegen_config_groups", config_groups_help, replace=True)
    if any(a in HELP_FLAGS for a in argv[1:]) and not any(a.startswith("hydra/help=") for a in argv[1:]):
        argv.append(f"hydra/help={app}")


def cfg_request(argv: list[str]):
    """Hydra's reading of the command line ``argv`` (``sys.argv``: the program first) when it asks for the job's config
    (``--cfg job|all``, ``-c``; not with ``--help``, which Hydra answers first), else None."""
    if not any(a.startswith(("--cfg", "-c")) and a not in ("-cn", "-cp", "-cd") for a in argv[1:]):
        return None
    from hydra._internal.utils import get_args_parser

    args, unknown = get_args_parser().parse_known_args(argv[1:])
    if args.cfg not in ("job", "all") or args.help or args.hydra_help or unknown:
        return None
    return args


def show_resolved_cfg(argv: list[str] | None = None, config_name: str = "config") -> bool:
    """Hydra's ``--cfg job`` / ``--cfg all`` (``-c``, ``-p <package>``, ``--resolve``) for an app whose config the project
    resolves further (``repdegen.reproduce.train``, ``repdegen.reproduce.describe``): Hydra would print its own
    composition without the experiment's file for the scale and before
    :func:`repdegen.reproduce.settings.config.finalize`. Printed instead: the config the run trains,
    :func:`repdegen.reproduce.settings.resolve.resolve`'s (the one ``repdegen.reproduce.describe`` shows); for
    ``all``, Hydra's own ``hydra:`` section follows, from Hydra (``sys.argv`` is set to ask it for ``--cfg hydra``; not
    resolved, its interpolations name the job's keys). With ``-m``: one line and exit status 2 (a sweep's jobs differ).
    Returns True when it printed everything, False when Hydra should go on (no ``--cfg``, ``--cfg hydra``, ``--help``...)."""
    argv = sys.argv if argv is None else argv
    args = cfg_request(argv)
    if args is None:
        return False
    package = None if args.package in (None, "_global_") else args.package
    if package is not None and (package == "hydra" or package.startswith("hydra.")):
        return False  # Hydra's own settings: the project does not change them
    if args.multirun:
        print("repdegen: error: --cfg with -m: each job of a sweep has its own config (the sweeper's values over these); "
              "print one job's: repdegen describe <the job's overrides> sources=true (or the same "
              "arguments without -m, with --cfg job)", file=sys.stderr)
        sys.exit(2)
    if args.config_path or args.config_dir:
        print("repdegen: error: --cfg with --config-path/--config-dir: the config a run trains is resolved from conf/ "
              "(and hydra.searchpath=[...]) only; add a config folder with hydra.searchpath, and python -m "
              "repdegen.reproduce.describe <overrides> prints the config", file=sys.stderr)
        sys.exit(2)
    from repdegen.reproduce.errors import install_hydra_error_handler

    install_hydra_error_handler()
    import hydra._internal.utils as hydra_utils  # its run_and_report, made to report as the apps do

    spec = hydra_utils.run_and_report(lambda: resolve(list(args.overrides), config_name=args.config_name or config_name))
    node = spec.cfg if package is None else OmegaConf.select(spec.cfg, package)
    if node is None:
        print(f"package '{package}' not found in config", file=sys.stderr)
        sys.exit(1)
    describe = " ".join(["repdegen describe", *args.overrides, "sources=true"])
    print(f"repdegen: --cfg {args.cfg}: the config this run trains (the experiment's files, the scale and budget applied, "
          f"finalized; config hash {spec.config_hash}); `{describe}` says where each value comes from",
          file=sys.stderr, flush=True)
    if not OmegaConf.is_config(node):
        print(node)
    else:
        if package is not None:
            print(f"# @package {package}")
        sys.stdout.write(OmegaConf.to_yaml(node, resolve=args.resolve))
    sys.stdout.flush()
    if args.cfg == "all" and package is None:  # Hydra's section as Hydra prints it, its interpolations unresolved (they
        # name the job's keys, which Hydra's --cfg hydra leaves out)
        argv[1:] = [*args.overrides, "--cfg", "hydra", *(["--config-name", args.config_name] if args.config_name else [])]
        return False
    return True


# ``repdegen <command>``: each command is an entry module's ``cli()`` (``python -m repdegen.reproduce.<command>`` runs
# the same); the arguments after the command are that command's own (Hydra overrides, --help, --cfg job ...)
COMMANDS = {
    "train": ("repdegen.reproduce.train", "train one experiment (a run in the ledger, resumable)"),
    "table": ("repdegen.reproduce.table", "regenerate a paper table: run the missing cells, render with the claims"),
    "describe": ("repdegen.reproduce.describe", "print the config a run or a table cell trains, and its hash"),
    "analyze": ("repdegen.reproduce.analyze", "analyse a trained run: geometry, neighbours, continuations"),
    "translate": ("repdegen.reproduce.translate", "translate with a trained MT run and score BLEU"),
    "report": ("repdegen.reproduce.report", "write results/README.md and the table pages from results/"),
    "status": ("repdegen.reproduce.status", "the ledger's runs training, stopped or failed: epoch, best, ETA"),
    "aggregate": ("repdegen.reproduce.aggregate", "aggregate a finished sweep into a table and plots"),
    "embeddings": ("repdegen.reproduce.embeddings", "a degeneration report (I(W), cosines, spectrum, groups) of any matrix"),
}


def usage() -> str:
    width = max(len(c) for c in COMMANDS) + 2
    lines = ["usage: repdegen <command> [arguments]   (repdegen <command> --help: the command's own help)", "",
             "commands:"]
    lines += [f"  {name:<{width}}{what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``repdegen <command> ...``: run the command's entry with the rest of the command line. No command, or an
    unknown one: the command list on stderr and exit status 2; ``repdegen --help``: the list on stdout, status 0."""
    import importlib
    import signal

    if hasattr(signal, "SIGPIPE"):  # `repdegen --help | head`: end quietly when the reader closes the pipe
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in HELP_FLAGS:
        print(usage())
        sys.exit(0)
    if not argv or argv[0] not in COMMANDS:
        what = "no command given" if not argv else f"{argv[0]!r} is not a command"
        print(f"repdegen: error: {what}; expected one of {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    command, rest = argv[0], argv[1:]
    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [sys.argv[0] if sys.argv else "repdegen", *rest]
    from repdegen.core import provenance

    provenance.ENTRY = f"repdegen {command}"
    module.cli()
