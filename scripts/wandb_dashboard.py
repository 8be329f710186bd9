"""Save the repdegen wandb dashboard (objectives compared) from its layout in docs/wandb_workspace.json.

    pip install wandb-workspaces          # the W&B Reports and Workspaces API (not a repdegen dependency)
    wandb login
    python scripts/wandb_dashboard.py --entity <user or team>                     # a saved workspace view
    python scripts/wandb_dashboard.py --entity <e> --group inan2017_t1/lite       # only one table's runs
    python scripts/wandb_dashboard.py --entity <e> --report                       # a report as well
    python scripts/wandb_dashboard.py --entity <e> --dry-run                      # build it, print it, save nothing

The layout is plain JSON (sections of line plots over the per-epoch history, bar charts of the run
summaries, media panels of the logged figures), so it lives in the repository and is edited there;
this script only translates it. The runs it shows are those ``logger=wandb`` writes (reproduce/engine/loggers.py),
grouped by objective (the runs' ``job_type``). Saving needs network access and a wandb account;
``--dry-run`` needs neither (a report's run sets look their project up, so ``--report`` is left out
of a dry run). docs/wandb.md describes the same dashboard for setting it up by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPEC = Path(__file__).resolve().parents[1] / "docs" / "wandb_workspace.json"
# the spec's runset.groupby names -> the API's (a workspace takes a Metric, a report's run set a string)
GROUPBY = {"job_type": ("JobType", "run.jobType"), "group": ("Group", "run.group")}


def load_spec(path: Path = SPEC) -> dict:
    spec = json.loads(Path(path).read_text())
    for section in spec["sections"]:
        for panel in section["panels"]:
            if panel["type"] not in ("line", "bar", "media"):
                raise ValueError(f"{path}: panel {panel.get('title')!r} has type {panel['type']!r}; expected line, bar or media")
    return spec


def runset_filter(spec: dict, group: str | None) -> str:
    filters = spec["runset"].get("filters", "")
    if group:
        filters = " and ".join(f for f in (filters, f"Metric('Group') == '{group}'") if f)
    return filters


def build_panels(section: dict, wr) -> list:
    panels = []
    for p in section["panels"]:
        if p["type"] == "line":
            panels.append(wr.LinePlot(title=p["title"], x=p.get("x", "Step"), y=p["y"], log_y=p.get("log_y") or None))
        elif p["type"] == "bar":
            panels.append(wr.BarPlot(title=p["title"], metrics=p["metrics"], orientation="v"))
        else:
            panels.append(wr.MediaBrowser(title=p["title"], media_keys=p["metrics"]))
    return panels


def build_workspace(spec: dict, entity: str, project: str, group: str | None = None):
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    settings = spec.get("settings", {})
    return ws.Workspace(
        entity=entity,
        project=project,
        name=spec["name"] + (f" ({group})" if group else ""),
        sections=[ws.Section(name=s["name"], panels=build_panels(s, wr), is_open=True) for s in spec["sections"]],
        settings=ws.WorkspaceSettings(x_axis=settings.get("x_axis", "Step"),
                                      smoothing_type=settings.get("smoothing", "none"),
                                      max_runs=settings.get("max_runs", 10)),
        runset_settings=ws.RunsetSettings(filters=runset_filter(spec, group),
                                          groupby=[ws.Metric(GROUPBY[g][0]) for g in spec["runset"].get("groupby", [])]),
    )


def build_report(spec: dict, entity: str, project: str, group: str | None = None):
    """One panel grid per section, each over the same run set (the run set looks its project up: online only)."""
    import wandb_workspaces.reports.v2 as wr

    runset = dict(entity=entity, project=project, name=group or "all runs", filters=runset_filter(spec, group),
                  groupby=[GROUPBY[g][1] for g in spec["runset"].get("groupby", [])])
    blocks = [wr.TableOfContents(), wr.P(spec["description"])]
    for s in spec["sections"]:
        blocks += [wr.H2(s["name"]), wr.PanelGrid(runsets=[wr.Runset(**runset)], panels=build_panels(s, wr))]
    return wr.Report(entity=entity, project=project, title=spec["name"] + (f" ({group})" if group else ""),
                     description=spec["description"], blocks=blocks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entity", required=True, help="wandb user or team that owns the project")
    parser.add_argument("--project", default="repdegen", help="logger.project of the runs (default: repdegen)")
    parser.add_argument("--group", help="only the runs of this wandb group, e.g. inan2017_t1/lite (a table at a scale)")
    parser.add_argument("--spec", type=Path, default=SPEC, help=f"layout (default: {SPEC.relative_to(SPEC.parents[1])})")
    parser.add_argument("--report", action="store_true", help="also save a report with the same panels")
    parser.add_argument("--dry-run", action="store_true", help="build the workspace and print it; save nothing")
    args = parser.parse_args(argv)
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        print("wandb_dashboard: the W&B Reports and Workspaces API is not installed: pip install wandb-workspaces",
              file=sys.stderr)
        return 2
    spec = load_spec(args.spec)
    workspace = build_workspace(spec, args.entity, args.project, args.group)
    if args.dry_run:
        print(json.dumps(workspace._spec, indent=1, default=str)[:4000])
        print(f"wandb_dashboard: built {len(spec['sections'])} sections; nothing saved (--dry-run)")
        return 0
    workspace.save()
    print(f"wandb_dashboard: workspace view saved: {workspace.url}")
    if args.report:
        report = build_report(spec, args.entity, args.project, args.group)
        report.save()
        print(f"wandb_dashboard: report saved: {report.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
