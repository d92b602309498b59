"""``advcli audit``: which rule the advantages a trainer computed follow, and the rows no rule
explains, classed by the field's known bugs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from advcli._runtime.process import load_numpy_bridge, require_stdout, use_threads
from advcli._runtime.signals import held
from advcli.cli.consoles import stderr, stdout
from advcli.cli.exits import reports_errors
from advcli.cli.option_table import option
from advcli.cli.options import (
    COLUMN_OPTIONS,
    ConfigOpt,
    Inputs,
    ThreadsOpt,
    dump_settings,
    with_options,
)
from advcli.cli.progress_bar import progress_bar
from advcli.errors import SettingsError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from advcli.settings.resolve import ExpectedRule

AdvantageColOpt = Annotated[
    str | None,
    option(
        "--advantage-col",
        help="The trainer's advantages: a list per token or one number per row [default: the "
        "trainer's name for it, else 'advantages', else 'advantage'].",
    ),
]
AuditJsonOpt = Annotated[
    Path | None, option("--json", help="Write the audit as JSON ('-' for stdout).")
]
AuditFailOnOpt = Annotated[
    str | None,
    option(
        "--fail-on",
        help="Exit 3 when the audit finds a bug ('any': a finding of any kind but "
        "turn-level-counting and per-token-advantages, which are none) or a finding of this "
        "kind (e.g. merged-groups).",
    ),
]
AuditMarkdownOpt = Annotated[
    Path | None, option("--markdown", help="Write the audit as Markdown ('-' for stdout).")
]
AuditHtmlOpt = Annotated[
    Path | None,
    option("--html", help="Write the audit as one self-contained HTML page ('-' for stdout)."),
]
ExpectOpt = Annotated[
    str | None,
    option(
        "--expect",
        help="The rule you believe the trainer ran, as key=value pairs (level, estimator, "
        "scale, singleton, epsilon, std, gigpo's gamma, step-weight, gigpo-norm, "
        "anchor-scope, and recipe; e.g. estimator=grpo,level=trajectory or "
        "recipe=verl-agent,gamma=0.95): a mismatch is a finding (unexpected-rule).",
    ),
]
AuditByOpt = Annotated[
    str | None,
    option(
        "--by",
        help="Each input file ('file') or each value of a column (e.g. step) is its own "
        "batch, also audited on its own (its rule and findings, a row each).",
    ),
]
ForceOpt = Annotated[bool, option("--force", help="Replace an existing report file.")]
QuietOpt = Annotated[bool, option("--quiet", "-q", help="No terminal report.")]


@with_options(*COLUMN_OPTIONS)
@reports_errors
def audit_command(  # noqa: PLR0913
    ctx: typer.Context,
    inputs: Inputs = None,
    advantage_col: AdvantageColOpt = None,
    expect: ExpectOpt = None,
    json_path: AuditJsonOpt = None,
    markdown: AuditMarkdownOpt = None,
    html: AuditHtmlOpt = None,
    fail_on: AuditFailOnOpt = None,
    by: AuditByOpt = None,
    force: ForceOpt = False,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Check the advantages a trainer computed: the rule they follow, and what no rule explains.

    Example: advcli audit train_data_step12.jsonl --fail-on any
    """
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.report.audit import tripped
        from advcli.run.audit import audit
        from advcli.write.outputs import goes_to_stdout

        load_numpy_bridge()
    check_fail_on_kind(ctx, fail_on, config_path)
    expected = expected_rule_of(expect)
    use_threads(threads)
    on_stdout = any(map(goes_to_stdout, (json_path, markdown, html)))
    if not quiet and not on_stdout:
        require_stdout("the report (pass --quiet)")
    names = replace(dump_settings(ctx).names, advantage=advantage_col)
    with progress_bar(not quiet, "opening") as on_stage:
        report = audit(
            inputs or [],
            names,
            expect=expected,
            json_path=json_path,
            markdown=markdown,
            html=html,
            force=force,
            by=by,
            on_stage=on_stage,
        )
    if not quiet:
        _show(report, stderr if on_stdout else stdout(), config_path)
    reason = tripped([finding["kind"] for finding in report["findings"]], fail_on)
    if reason is not None:
        typer.echo(f"advcli audit: the audit has {reason}", err=True)
        raise typer.Exit(3)


def check_fail_on_kind(ctx: typer.Context, fail_on: str | None, config_path: Path | None) -> None:
    """Refuse a ``--fail-on`` that is neither 'any' nor a finding's kind."""
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.report.audit import KINDS

    if fail_on is None or fail_on == "any" or fail_on in KINDS:
        return
    source = ctx.get_parameter_source("fail_on")
    saved = (
        f" ('fail-on' in {config_path}: a [compare] table keeps compare's)"
        if source is not None and source.name == "DEFAULT_MAP"
        else ""
    )
    raise UsageError(
        f"--fail-on takes 'any' or a finding's kind ({', '.join(KINDS)}), not '{fail_on}'{saved}"
    )


def expected_rule_of(expect: str | None) -> ExpectedRule | None:
    """``--expect``'s rule; its errors are usage errors (exit 2)."""
    if expect is None:
        return None
    from advcli.settings.resolve import expected_rule

    try:
        return expected_rule(expect)
    except SettingsError as error:
        raise UsageError(str(error)) from None


def _show(report: dict[str, Any], console: Console, config_path: Path | None) -> None:
    from advcli.cli.terminal import render_audit
    from advcli.report.views import visible

    render_audit(report, console)
    if config_path is not None:
        console.print(Text(f"config: {visible(config_path)}"))
