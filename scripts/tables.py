"""The figures of the docs' tables, kept in `docs/data/*.json` and written into the pages.

    python scripts/tables.py              # rewrite every table block of README.md and docs/
    python scripts/tables.py --check      # exit 1, naming the pages, where a block is stale
    python scripts/tables.py collect FILE TABLE WORKDIR...  # a table's rows from evaluated runs
    python scripts/tables.py compared FILE TABLE CSV --metrics ... --cpu ... --source ...

A page marks each generated table with a pair of comments; what lies between them is written
here, never by hand:

    <!-- table results/text columns=method,id.acc,ood.mean rows=single,hydra_circuit -->
    ...
    <!-- end table -->

`results/text` is the table `text` of `docs/data/results.json`; `columns` and `rows` (both
optional) pick columns by name and rows by their first cell, in the order given. A table in a
data file:

    {"cpu": "2-core AMD EPYC Zen 4", "date": "2026-12-04", "source": "...",
     "columns": [{"name": "id.acc", "header": "acc %", "fmt": ".2f", "scale": 100}, ...],
     "rows": [{"method": "single", "id.acc": 82.69, ...}, ...]}

A column reads the row's value under its `name`, or under each of its `keys` (a cell of several
figures, joined by `join`: " / " by default); a column with `from` reads them from another table
of the file, so a figure is kept once (`_referenced`). `style` renders the keys as an interval
("[lo, hi]"), a mean and standard deviation ("m +- s") or a verdict ("d [lo, hi] wins", where
the interval decides); `fmt` is Python's format spec (or one per key), `null` prints "-".
`scale` is what a `results.json` value is multiplied by when `collect` copies it (100 for a
percentage); a column's name (or keys) is then its path in the method's results,
`ood.mean.auroc` (`collect` says how seeds and "a - b" rows are read).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "docs" / "data"
PAGES = ("README.md", "docs/*.md", "docs/tutorials/*.md")
BLOCK = re.compile(r"^<!-- table (\S+)(.*?) -->\n.*?^<!-- end table -->$", flags=re.S | re.M)
# A config's fields (`<!-- fields MODULE -->`): MODULE's `get_config()` defaults, its `smoke`
# variant's where they differ, and its `HELP`.
FIELDS = re.compile(r"^<!-- fields (\S+) -->\n.*?^<!-- end fields -->$", flags=re.S | re.M)


def pages(repo: Path = REPO) -> list[Path]:
    return sorted({p for pattern in PAGES for p in repo.glob(pattern)})


def load(name: str, data: Path = DATA) -> dict[str, Any]:
    """`name` is FILE/TABLE: the table TABLE of `data/FILE.json`, its `from` columns filled."""
    file, _, table = name.partition("/")
    tables = json.loads((data / f"{file}.json").read_text())
    if table not in tables:
        raise KeyError(f"{file}.json has no table {table!r}; it has {', '.join(tables)}")
    return _referenced(tables, tables[table])


def _referenced(tables: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """`table` with each `from` column's figures read from another table of its file: the
    column `{"from": "demo_text_diff", "row": "pair", "keys": [...]}` reads `keys` of the row
    of `demo_text_diff` whose first cell is this row's `pair` (no such row: "-")."""
    columns, rows = [], [dict(r) for r in table["rows"]]
    for column in table["columns"]:
        if "from" not in column:
            columns.append(column)
            continue
        if column["from"] not in tables:
            raise KeyError(f"column {column['name']} reads {column['from']!r}, not in its file")
        source = tables[column["from"]]
        first = source["columns"][0]["name"]
        by_first = {str(r[first]): r for r in source["rows"]}
        keys = [f"{column['name']}:{k}" for k in column["keys"]]
        for row in rows:
            found = by_first.get(str(row.get(column["row"])), {})
            row.update({mine: found.get(k) for mine, k in zip(keys, column["keys"], strict=True)})
        columns.append({**column, "keys": keys})
    return {**table, "columns": columns, "rows": rows}


def _number(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return format(value, fmt) if isinstance(value, (int, float)) else str(value)


def cell(column: dict[str, Any], row: dict[str, Any]) -> str:
    keys = column.get("keys", [column["name"]])
    fmt = column.get("fmt", "")
    values = [row.get(k) for k in keys]
    style = column.get("style")
    if style is None:
        fmts = fmt if isinstance(fmt, list) else [fmt] * len(keys)
        return column.get("join", " / ").join(
            _number(v, f) for v, f in zip(values, fmts, strict=True)
        )
    if None in values:
        return "-"
    if style == "interval":
        lo, hi = values
        return f"[{_number(lo, fmt)}, {_number(hi, fmt)}]"
    if style == "mean_std":
        mean, std = values
        return f"{_number(mean, fmt)} +- {_number(std, fmt.lstrip('+'))}"
    if style == "verdict":
        d, lo, hi = values
        verdict = "**wins**" if lo > 0 else "loses" if hi < 0 else "draw"
        return f"{_number(d, fmt)} [{_number(lo, fmt)}, {_number(hi, fmt)}] {verdict}"
    raise ValueError(f"column {column['name']}: unknown style {style!r}")


def caption(table: dict[str, Any]) -> str:
    parts = [table["cpu"], table["date"]] + ([table["source"]] if table.get("source") else [])
    return "*" + "; ".join(parts) + ".*"


def render(
    table: dict[str, Any], columns: list[str] | None = None, rows: list[str] | None = None
) -> str:
    by_name = {c["name"]: c for c in table["columns"]}
    unknown = [c for c in columns or () if c not in by_name]
    if unknown:
        raise KeyError(f"no column {unknown}; the table has {', '.join(by_name)}")
    chosen = [by_name[c] for c in columns] if columns else table["columns"]
    first = table["columns"][0]["name"]
    by_first = {str(r[first]): r for r in table["rows"]}
    missing = [r for r in rows or () if r not in by_first]
    if missing:
        raise KeyError(f"no row {missing}; the table has {', '.join(by_first)}")
    picked = [by_first[r] for r in rows] if rows else table["rows"]
    lines = [caption(table), "", "| " + " | ".join(c["header"] for c in chosen) + " |"]
    lines.append("|" + "---|" * len(chosen))
    lines += ["| " + " | ".join(cell(c, r) for c in chosen) + " |" for r in picked]
    return "\n".join(lines)


def _options(text: str) -> dict[str, list[str]]:
    options = dict(re.findall(r"(\w+)=(\S+)", text))
    unknown = set(options) - {"columns", "rows"}
    if unknown:
        raise ValueError(f"unknown table option(s) {sorted(unknown)}: columns= and rows= exist")
    return {k: v.split(",") for k, v in options.items()}


def rewrite(text: str, data: Path = DATA) -> str:
    """`text` with every table block generated afresh from `data`."""

    def block(match: re.Match) -> str:
        name, options = match.group(1), _options(match.group(2))
        head = match.group(0).splitlines()[0]
        return f"{head}\n{render(load(name, data), **options)}\n<!-- end table -->"

    return FIELDS.sub(lambda m: fields(m.group(1)), BLOCK.sub(block, text))


def fields(module_name: str) -> str:
    """The fields block of a config module: every field, its default, its smoke value, its help."""
    import importlib

    from hydra_jax.experiments.workdir import flat

    module = importlib.import_module(module_name)
    full, smoke = flat(module.get_config()), flat(module.get_config("smoke"))
    missing = sorted(set(full) ^ set(module.HELP))
    if missing:
        raise KeyError(f"{module_name}.HELP and its config differ in {missing}")

    def shown(value: Any) -> str:
        return f"`{json.dumps(value)}`"

    lines = [f"<!-- fields {module_name} -->", "| field | default | `smoke` | meaning |"]
    lines.append("|---|---|---|---|")
    for key, value in full.items():
        other = shown(smoke[key]) if smoke[key] != value else ""
        lines.append(f"| `{key}` | {shown(value)} | {other} | {module.HELP[key]} |")
    return "\n".join([*lines, "<!-- end fields -->"])


def _path(result: Any, key: str) -> Any:
    for part in key.split("."):
        result = result.get(part) if isinstance(result, dict) else None
    return result


def collect(file: str, table: str, workdirs: list[Path], data: Path = DATA) -> None:
    """Fills `table`'s rows from evaluated workdirs (one per study seed), scaled by `scale`.

    A row named "a - b" gets the mean OOD AUROC difference of methods a and b with its paired
    bootstrap interval pooled over the workdirs (in points; `hydra-jax compare`'s row
    `ood.mean.auroc`, the path a user's own tables take); any other row is a method: a
    `mean_std` column takes the mean and std over workdirs of the headline metric its header
    names (`hydra_jax.evaluation.seeds.HEADLINE`: `hydra-jax compare`'s mean and std where it
    is one results path, the seeds summary's for the means over shifted sets), any other
    column the value at its path in the method's `results.json` entry (one workdir).
    """
    from hydra_jax.evaluation import seeds
    from hydra_jax.experiments import compare

    path = data / f"{file}.json"
    tables = json.loads(path.read_text())
    target = tables[table]
    first, *columns = target["columns"]
    results = seeds.load_results(workdirs)
    by_seed = any(c.get("style") == "mean_std" for c in columns)
    summary = seeds.summarize(results) if by_seed else {}
    headline = {label: (".".join(path), scale) for label, path, scale in seeds.HEADLINE}
    for row in target["rows"]:
        name = str(row[first["name"]])
        if " - " in name:
            a, b = name.split(" - ")
            (auroc,) = compare.compare(workdirs, a, b, only=("ood.mean.auroc",))
            interval = [auroc.diff_low, auroc.diff_high]
            values = {"interval": interval, "verdict": [auroc.diff, *interval]}
        elif by_seed:
            over_seeds = compare.mean_std(results, name)
        for column in columns:
            keys = column.get("keys", [column["name"]])
            if " - " in name:
                found = values.get(column.get("style"), [auroc.diff])
                found = [100 * v for v in found]
            elif column.get("style") == "mean_std":
                found = [*summary[name][column["header"]]]
                if column["header"] in headline:  # a results path: as `hydra-jax compare` has it
                    where, scale = headline[column["header"]]
                    mean, std = over_seeds[where]
                    found = [scale * mean, scale * std]
            else:
                if len(results) != 1:
                    raise ValueError(f"column {column['name']} reads one workdir's results")
                found = [_path(results[0]["methods"][name], k) for k in keys]
                found = [None if v is None else v * column.get("scale", 1) for v in found]
            row.update(zip(keys, found, strict=True))
    path.write_text(dump(tables))


def compared(
    file: str, table: str, csv_path: Path, metrics: list[str], cpu: str, source: str,
    data: Path = DATA,
) -> None:  # fmt: skip
    """Writes `table` from a `hydra-jax compare --csv` file: one row per metric of `metrics`
    (its results path), with A's and B's mean +- std over seeds, the difference, its interval
    and A's verdict (the metric's better side decides: `compare.direction`)."""
    import csv
    import datetime
    import math

    with open(csv_path) as handle:
        by = {row["metric"]: row for row in csv.DictReader(handle)}
    missing = [m for m in metrics if m not in by]
    if missing:
        raise KeyError(f"{csv_path} has no {missing}")
    rows = []
    for metric in metrics:
        row = {
            k: float(v) if math.isfinite(float(v)) else None  # JSON has no NaN
            for k, v in by[metric].items()
            if k not in ("metric", "better", "verdict")
        }
        rows.append({"metric": metric, "a.mean": row["a_mean"], "a.std": row["a_std"],
                     "b.mean": row["b_mean"], "b.std": row["b_std"], "diff": row["diff"],
                     "interval.lo": row["diff_low"], "interval.hi": row["diff_high"],
                     "verdict": by[metric]["verdict"] or "-"})  # fmt: skip
    path = data / f"{file}.json"
    tables = json.loads(path.read_text())
    tables[table] = {
        "cpu": cpu, "date": datetime.date.today().isoformat(), "source": source,
        "columns": [
            {"name": "metric", "header": "metric"},
            {"name": "a", "header": "A", "keys": ["a.mean", "a.std"], "style": "mean_std",
             "fmt": ".4f"},
            {"name": "b", "header": "B", "keys": ["b.mean", "b.std"], "style": "mean_std",
             "fmt": ".4f"},
            {"name": "diff", "header": "A - B", "fmt": "+.4f"},
            {"name": "interval", "header": "95% interval", "keys": ["interval.lo", "interval.hi"],
             "style": "interval", "fmt": "+.4f"},
            {"name": "verdict", "header": "A"},
        ],
        "rows": rows,
    }  # fmt: skip
    path.write_text(dump(tables))


def dump(tables: dict[str, Any]) -> str:
    """A data file's text: a table's fields one per line, each column and each row on one."""

    def one(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    out = []
    for name, table in tables.items():
        fields = []
        for key, value in table.items():
            if key in ("columns", "rows"):
                items = ",\n".join(f"   {one(v)}" for v in value)
                fields.append(f'  "{key}": [\n{items}\n  ]')
            else:
                fields.append(f'  "{key}": {one(value)}')
        out.append(f'  "{name}": {{\n' + ",\n".join(fields) + "\n  }")
    return "{\n" + ",\n".join(out) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail where a page is stale")
    sub = parser.add_subparsers(dest="command")
    take = sub.add_parser("collect", help="a table's rows from an evaluated workdir")
    take.add_argument("file")
    take.add_argument("table")
    take.add_argument("workdirs", type=Path, nargs="+", help="one per study seed")
    table = sub.add_parser("compared", help="a table from a `hydra-jax compare --csv` file")
    table.add_argument("file")
    table.add_argument("table")
    table.add_argument("csv", type=Path)
    table.add_argument("--metrics", required=True, help="results paths, comma-separated")
    table.add_argument("--cpu", required=True)
    table.add_argument("--source", required=True)
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.file, args.table, args.workdirs)
    if args.command == "compared":
        compared(args.file, args.table, args.csv, args.metrics.split(","), args.cpu, args.source)
    stale = []
    for page in pages():
        text = page.read_text()
        new = rewrite(text)
        if new != text:
            stale.append(str(page.relative_to(REPO)))
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        print(f"stale tables in {', '.join(stale)}: run `make tables`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
