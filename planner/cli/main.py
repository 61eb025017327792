"""The `hetplan` command line: one typer app, commands registered from their own modules.

Each module in `COMMAND_MODULES` exposes `register(app)`; adding a command is one line here.
Errors are handled in one place (`main`): a bad input becomes one line `error: <field>: <reason>`
on stderr and exit status 2, with no traceback and nothing on stdout.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import typer
import yaml
from pydantic import ValidationError

from planner.errors import HetplanError

try:  # typer >= 0.2x vendors click; older typer uses the click package
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exc  # type: ignore[no-redef]

EXIT_USAGE = 2

COMMAND_MODULES: tuple[str, ...] = (
    "planner.cli.catalog",
    "planner.cli.estimate",
    "planner.cli.evaluate_cmd",
    "planner.cli.plan_cmd",
    "planner.cli.calibrate_cmd",
    "planner.cli.emit_cmd",
    "planner.cli.explain_cmd",
    "planner.cli.profile_cmd",
    "planner.cli.bench_cmd",
)


def build_app() -> typer.Typer:
    """A fresh app with every command module registered (no module-level state)."""
    app = typer.Typer(
        name="hetplan",
        help="Parallelism plans for LLM training on heterogeneous GPU pools.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)
    return app


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _usage_field(exc: click_exc.UsageError) -> str:
    """The option or argument a click usage error is about, else 'usage'."""
    if isinstance(exc, click_exc.NoSuchOption):
        return exc.option_name
    if isinstance(exc, click_exc.BadParameter) and exc.param is not None:
        opts = getattr(exc.param, "opts", None) or []
        if getattr(exc.param, "param_type_name", "") == "argument":
            return str(getattr(exc.param, "metavar", None) or exc.param.name or "argument")
        return max(opts, key=len) if opts else (exc.param.name or "usage")
    return "usage"


def _usage_reason(exc: click_exc.UsageError) -> str:
    if isinstance(exc, click_exc.MissingParameter):
        return "is required"
    text = exc.message if isinstance(exc, click_exc.BadParameter) else exc.format_message()
    return text.removeprefix("Value error, ")


def error_line(exc: BaseException) -> str:
    """The single stderr line for an input error."""
    if isinstance(exc, HetplanError):
        field, reason = exc.field, exc.reason
    elif isinstance(exc, click_exc.UsageError):
        field, reason = _usage_field(exc), _usage_reason(exc)
    elif isinstance(exc, ValidationError):
        from planner.specs.loading import first_error

        err = first_error(exc, "")
        field, reason = err.field, err.reason
    elif isinstance(exc, yaml.YAMLError):
        field, reason = "yaml", f"malformed YAML: {getattr(exc, 'problem', None) or exc}"
    elif isinstance(exc, OSError):
        field, reason = str(exc.filename or "file"), exc.strerror or str(exc)
    else:
        field, reason = "error", str(exc)
    return _one_line(f"error: {field}: {reason}" if field else f"error: {reason}")


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit status (0 ok, 2 bad input)."""
    app = build_app()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=args, prog_name="hetplan", standalone_mode=False)
    except click_exc.NoArgsIsHelpError as exc:
        sys.stderr.write(exc.ctx.get_help() + "\n" if exc.ctx else "")
        return EXIT_USAGE
    except (HetplanError, click_exc.UsageError, ValidationError, yaml.YAMLError, OSError) as exc:
        sys.stdout.flush()
        sys.stderr.write(error_line(exc) + "\n")
        return EXIT_USAGE
    except typer.Abort:
        sys.stderr.write("error: aborted\n")
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
