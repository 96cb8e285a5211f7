"""The documents are true of the repository: every relative markdown link (and its #anchor) in
README.md and docs/ resolves, every repository path they name in backticks exists, no tracked
file names a path of the authors' machine, every setting and route is documented, and every
setting the documents name exists; so does every command line (`jupyter-gpu-gov` subcommand and
option, `make` target, `python -m` module), event, metric and environment variable, both ways
where the package has a list; and the configuration examples are what the hub accepts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jupyter_gpu_gov"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
# A backticked name is a repository path when it starts at a folder the repository has (the
# top level or a subpackage, which the docs name without the `jupyter_gpu_gov/` prefix) and
# ends like a file or a folder; `<placeholders>` and generated folders (dist/, .demo/) are not.
FILE_LIKE = re.compile(r"\.(py|md|ts|tsx|json|ya?ml|toml|css|html|sh|txt|cfg|jsonl)$|/$")


def _tops() -> set[str]:
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    tops |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}
    return tops - {"node_modules", "dist"}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _exists(name: str, doc: Path) -> bool:
    roots = [ROOT, doc.parent, PACKAGE, ROOT / "labextension"]
    return any(any(root.glob(name.rstrip("/"))) for root in roots)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    bad = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z+.-]*:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)}: dangling links: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(doc):
    tops = _tops()
    missing = [
        name
        for name in CODE.findall(doc.read_text(encoding="utf-8"))
        if "/" in name
        and "<" not in name
        and name.split("/")[0] in tops
        and FILE_LIKE.search(name)
        and not _exists(name, doc)
    ]
    assert not missing, f"{doc.relative_to(ROOT)} names paths the repository lacks: {missing}"


# `tests/test_x.py::test_y` names a test, `core/report.validate` a module's function or class,
# `core/vocabulary.py:100` a line: none ends like a file, so the check above passed them by, and
# a test or function renamed since left its old name in the documents.
DEFINED = re.compile(r"^((?:[\w-]+/)*[\w-]+)(?:\.py::(\w+)(?:\[[^\]]*\])?|\.(\w+)|\.py:(\d+))$")


def _defines(file: Path, name: str) -> bool:
    pattern = rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{name}\b|^{name}[ \t]*[:=]"
    return re.search(pattern, file.read_text(encoding="utf-8"), re.M) is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_tests_functions_and_lines_exist(doc):
    tops = _tops()
    bad = []
    for name in CODE.findall(doc.read_text(encoding="utf-8")):
        m = DEFINED.match(name)
        if not m or FILE_LIKE.search(name):
            continue
        module, test, attr, line = m.groups()
        if name.split("/")[0] not in tops if "/" in name else test is None:
            continue  # `test_x.py::test_y` alone is a test too; `x.y` alone is not a path
        files = [
            root / f"{module}.py"
            for root in (ROOT, ROOT / "tests", PACKAGE)
            if (root / f"{module}.py").is_file()
        ]
        if not files:
            if attr is None:  # `dir/name.ext` of an extension not listed above is not ours
                bad.append(f"{name}: no {module}.py")
            continue
        if line is not None:
            if int(line) > len(files[0].read_text(encoding="utf-8").splitlines()):
                bad.append(f"{name}: {module}.py has fewer lines")
        elif not any(_defines(file, test or attr) for file in files):
            bad.append(f"{name}: {module}.py defines no {test or attr}")
    assert not bad, f"{doc.relative_to(ROOT)} names what the repository lacks: {bad}"


def test_no_path_of_the_authors_machine():
    """No tracked file names a path that exists only where it was written (the workspace's
    folders); tests/test_architecture.py keeps out the design file and sibling folders."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    outside = "/" + "work/"  # in two halves, so this file does not name it
    bad = []
    for name in filter(None, tracked.split("\0")):
        path = ROOT / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        bad += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if outside in line]
    assert not bad, f"paths of the authors' machine: {bad}"


def test_documents_name_no_scratch_path():
    """A measurement run from another tree names it by commit (`<a worktree of COMMIT>`), never
    by the scratch folder it happened to be in: nobody else has that folder."""
    bad = [
        f"{doc.relative_to(ROOT)}:{n}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"(?<![\w.])/tmp/", line)
    ]
    assert not bad, f"scratch paths outside the repository: {bad}"


# -- settings and endpoints: each one a user or admin can use is documented, and each the
# documents name exists ------------------------------------------------------------------------


def _text(*names: str) -> str:
    return "\n".join((ROOT / name).read_text(encoding="utf-8") for name in names)


def _settings() -> dict[str, set[str]]:
    from jupyter_server.extension.application import ExtensionApp

    from jupyter_gpu_gov.hub.settings import GovernorSettings
    from jupyter_gpu_gov.profiles.cluster import ClusterGpus
    from jupyter_gpu_gov.profiles.config import GpuProfiles
    from jupyter_gpu_gov.profiles.local import LocalGpus
    from jupyter_gpu_gov.server.app import GpuGovApp

    inherited = set(ExtensionApp.class_trait_names(config=True))
    return {
        "GpuGovernor": set(GovernorSettings.class_trait_names(config=True)),
        "GpuGovApp": set(GpuGovApp.class_trait_names(config=True)) - inherited,
        "GpuProfiles": set(GpuProfiles.class_own_traits(config=True)),
        "LocalGpus": set(LocalGpus.class_own_traits(config=True)),
        "ClusterGpus": set(ClusterGpus.class_own_traits(config=True)),
    }


def test_every_setting_is_documented():
    """A setting is named in README.md or docs/api.md (the profile layer's may be in
    docs/profiles.md, its reference)."""
    governor = _text("README.md", "docs/api.md")
    profiles = governor + _text("docs/profiles.md")
    missing = [
        f"{cls}.{name}"
        for cls, names in _settings().items()
        for name in sorted(names)
        if not re.search(
            rf"\b{name}\b", governor if cls in ("GpuGovernor", "GpuGovApp") else profiles
        )
    ]
    assert not missing, f"settings no document names: {missing}"


def test_every_setting_the_documents_name_exists():
    settings = _settings()
    bad = [
        f"{doc.relative_to(ROOT)}: c.{cls}.{name}"
        for doc in (ROOT / p for p in ("README.md", *(f"docs/{d}.md" for d in OWN_DOCS)))
        for cls, name in re.findall(r"\bc\.(\w+)\.(\w+)", doc.read_text(encoding="utf-8"))
        if cls in settings and name not in settings[cls]
    ]
    assert not bad, f"documented settings that do not exist: {bad}"


OWN_DOCS = ("api", "architecture", "security", "profiles")


def _routes() -> list[tuple[str, str]]:
    """(route, the text that must document it) of every HTTP route we serve."""
    from traitlets.config import Config

    from jupyter_gpu_gov.hub.pages import page_handlers
    from jupyter_gpu_gov.hub.policy_api import policy_handlers
    from jupyter_gpu_gov.hub.policy_page import policy_page_handlers
    from jupyter_gpu_gov.hub.routes import handlers
    from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles
    from jupyter_gpu_gov.server import routes as server_routes

    service = "/services/gpu-gov/"
    c = Config()
    c.JupyterHub.extra_handlers = []
    add_gpu_profiles(c, spawner="simple")
    routes = [
        route[0]
        for make in (handlers, page_handlers, policy_handlers, policy_page_handlers)
        for route in make(service, None)
    ]
    routes += [route[0] for route in server_routes.handlers()]
    routes += ["/hub" + route[0] for route in c.JupyterHub.extra_handlers]
    return routes


def _documented(path: str, api: str) -> bool:
    """``path`` as docs/api.md writes it: in full, relative to the governor service
    (`GET api/reports`), or as a sibling of a documented route (`…/extend`)."""
    relative = path.removeprefix("/services/gpu-gov/")
    parent, _, last = path.rpartition("/")
    return (
        path in api
        or bool(relative and re.search(rf"`(?:[A-Z]+ )?{re.escape(relative)}\b", api))
        or (parent in api and f"…/{last}" in api)
    )


# A group of a route's pattern: (?P<name>...), (...) or (?:...(...)...), maybe optional.
GROUP = re.compile(r"\((?:\?P<\w+>|\?:)?[^()]*(?:\([^()]*\)[^()]*)*\)\??")


def test_every_endpoint_is_in_the_api_reference():
    """Every route we serve (the governor's, the server extension's, the profile layer's in
    the hub) is in docs/api.md: its path up to the first parameter, then each part after one
    as `…/part`."""
    api = _text("docs/api.md")
    missing = []
    for route in _routes():
        first, *rest = [
            part.rstrip("/?").replace("\\.", ".") for part in GROUP.sub("\0", route).split("\0")
        ]
        if not _documented(first, api) or any(
            f"…{part}" not in api for part in rest if part.strip("/")
        ):
            missing.append(route)
    assert not missing, f"routes docs/api.md does not document: {missing}"


def test_every_policy_key_is_in_the_api_reference():
    """docs/api.md's "Policy keys" table names every key a policy may have, and no other."""
    from jupyter_gpu_gov.core.policy import _POLICY_KEYS

    api = _text("docs/api.md")
    table = api[api.index("### Policy keys") : api.index("### GPU health")]
    documented = {
        k for row in re.findall(r"^\| (`.+?`) \|", table, re.M) for k in CODE.findall(row)
    }
    keys = _POLICY_KEYS  # every field but what the service sets (in_force_since)
    assert documented == keys, f"missing: {keys - documented}, not keys: {documented - keys}"


# -- command lines: each `jupyter-gpu-gov COMMAND --option` the documents show is one the
# command line has, and each jupyterhub-idle-culler option the README lists is the service's --


def _code_spans(text: str) -> list[str]:
    """The documents' code: each line of a fenced block (with its `\\` continuations) and each
    inline code span (which may wrap onto the next line)."""
    spans = []
    for n, part in enumerate(re.split(r"^ *```.*$", text, flags=re.M)):
        if n % 2:
            spans += part.replace("\\\n", " ").splitlines()
        else:
            spans += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", part)]
    return spans


def _cli_options() -> dict[str, set[str]]:
    """Each subcommand's options, as its --help lists them."""
    import contextlib
    import io

    from jupyter_gpu_gov import cli

    def help_of(*argv: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main([*argv, "--help"])
        return out.getvalue()

    names = re.findall(r"^    ([a-z][\w-]*)", help_of(), re.M)  # COMMAND's list
    return {name: set(re.findall(r"(?<![\w-])--?[a-z][\w-]*", help_of(name))) for name in names}


def test_every_command_line_the_documents_show_exists():
    """`jupyter-gpu-gov usage --group-by …`: a subcommand the CLI has, with options it has.
    docs/benchmarks-history.md is left out: it quotes the command lines of its day."""
    options = _cli_options()
    assert {"replay", "what-if", "usage"} <= options.keys(), options.keys()
    bad = []
    for doc in (d for d in DOCS if d.name != "benchmarks-history.md"):
        for span in _code_spans(doc.read_text(encoding="utf-8")):
            for command in re.split(r"(?=\bjupyter-gpu-gov )", span)[1:]:
                name, _, rest = command.removeprefix("jupyter-gpu-gov ").partition(" ")
                rest = rest.split(" | ")[0]  # a pipe's next command is not this one's
                if name not in options:
                    bad.append(f"{doc.name}: `jupyter-gpu-gov {name}`: no such command")
                    continue
                bad += [
                    f"{doc.name}: `jupyter-gpu-gov {name} … {flag}`: no such option"
                    for flag in re.findall(r"(?<![\w-])--?[a-z][\w-]*", rest)
                    if flag not in options[name]
                ]
    assert not bad, bad


def test_the_idle_culler_options_the_readme_lists_are_the_services():
    from jupyter_gpu_gov.hub.app import GpuGovernor

    readme = _text("README.md")
    sentence = readme[readme.index("It accepts jupyterhub-idle-culler") :].split("), as")[0]
    listed = set(re.findall(r"`--([\w-]+)`", sentence))
    assert {"timeout", "cull-every", "url"} <= listed, sentence
    assert listed <= set(GpuGovernor.aliases), listed - set(GpuGovernor.aliases)


def test_the_documents_configuration_examples_are_accepted():
    """Each document's `python` examples that configure the hub (`c.…`), run in order on one
    config, are what the hub would start with: tiers, quotas and cards as `add_gpu_profiles`
    checks them, policies as the governor loads them. A `[...]` placeholder block is left out."""
    import textwrap

    from traitlets.config import Config

    from jupyter_gpu_gov.core.policy import load_policies
    from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

    checked = []
    for doc in DOCS:
        blocks = re.findall(
            r"^ *```python\n(.*?)^ *```", doc.read_text(encoding="utf-8"), re.M | re.S
        )
        blocks = [textwrap.dedent(b) for b in blocks if "c.Gpu" in b and "[...]" not in b]
        if not blocks:
            continue
        c = Config()
        for block in blocks:
            exec(block, {"c": c})  # as a reader pastes it into jupyterhub_config.py
        if "GpuProfiles" in c:
            c.JupyterHub.extra_handlers = []
            add_gpu_profiles(c, spawner="simple")
        gov = c.GpuGovernor
        load_policies(gov.get("policies", []), gov.get("policy_defaults", {}))
        checked.append(doc.name)
    assert {"README.md", "profiles.md"} <= set(checked), checked


def test_every_make_target_and_module_the_documents_run_exists():
    """`make bench-full` is a target of the Makefile; `python -m benchmarks.replay.generate` a
    module of the repository (or the one tool the docs install from outside: `build`)."""
    import importlib.util

    targets = set(re.findall(r"^([\w-]+):", _text("Makefile"), re.M))
    bad = []
    for doc in DOCS:
        for span in _code_spans(doc.read_text(encoding="utf-8")):
            bad += [
                f"{doc.name}: `make {t}`: no such target"
                for t in re.findall(r"(?:^|&&|;)\s*make ([a-z][\w-]*)", span.strip())
                if t not in targets
            ]
            bad += [
                f"{doc.name}: `python -m {m}`: no such module"
                for m in re.findall(r"\bpython -m ([\w.]+)", span)
                if m != "build" and importlib.util.find_spec(m) is None
            ]
    assert not bad, bad


def test_every_event_the_server_emits_is_in_the_api_reference():
    api = _text("docs/api.md")
    missing = [
        schema.name
        for schema in sorted((PACKAGE / "events").glob("*.yaml"))
        if re.search(r'^"\$id": (\S+)', schema.read_text(encoding="utf-8"), re.M)[1] not in api
        or schema.name not in api
    ]
    assert not missing, f"event schemas docs/api.md does not describe: {missing}"


def test_every_metric_is_documented_and_every_documented_metric_exists():
    """Prometheus metric names: those the package defines, and those README.md and docs/ name
    (docs/benchmarks-history.md, a log of its day, left out)."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    defined = set(re.findall(r'"(jupyter_gpu_gov_[a-z_]+)"', source))
    docs = "\n".join(
        d.read_text(encoding="utf-8") for d in DOCS if d.name != "benchmarks-history.md"
    )
    named = set(re.findall(r"\bjupyter_gpu_gov_[a-z_]+", docs))
    named = {re.sub(r"_(bucket|count|sum|created)$", "", n) for n in named}
    assert len(defined) > 20, defined
    assert defined <= named, f"metrics no document names: {defined - named}"
    assert named <= defined, f"documented metrics the package lacks: {named - defined}"


def test_the_governors_counters_say_what_they_count():
    """A scrape's HELP lists every label value a counter takes: an admin graphing culls by
    reason, or warnings, reads there which there are."""
    from jupyter_gpu_gov.core.vocabulary import CULL_REASONS, WARNINGS
    from jupyter_gpu_gov.hub import metrics

    help_of = {m.name: m.documentation for m in metrics.REGISTRY.collect()}
    culls, warnings = help_of["jupyter_gpu_gov_culls"], help_of["jupyter_gpu_gov_warnings"]
    assert [r for r in CULL_REASONS if r not in culls] == [], culls
    assert sorted(w for w in WARNINGS if w not in warnings) == [], warnings


def test_every_environment_variable_is_documented_and_every_documented_one_is_read():
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    read = set(re.findall(r"\bJUPYTER_GPU_GOV_[A-Z_]+", source))
    docs = "\n".join(d.read_text(encoding="utf-8") for d in DOCS)
    named = set(re.findall(r"\bJUPYTER_GPU_GOV_[A-Z_]+", docs))
    assert read == named, f"not documented: {read - named}, not read: {named - read}"


def test_every_benchmark_option_the_documents_show_exists():
    """`python -m benchmarks.reconcile --servers 10000 --changed 0.01`: each option a current
    document shows is one the benchmark's --help lists (docs/benchmarks.md is the current
    state now; its history quotes the command lines of their day and is left out). An option
    renamed left a command no reader could run."""
    import contextlib
    import io
    import runpy
    import sys
    import warnings

    def options_of(module: str, *sub: str) -> set[str]:
        out, argv = io.StringIO(), sys.argv
        sys.argv = [module, *sub, "--help"]
        try:
            # a module another test imported runs again: runpy's warning says so
            with (
                contextlib.redirect_stdout(out),
                contextlib.suppress(SystemExit),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("ignore", RuntimeWarning)
                runpy.run_module(module, run_name="__main__", alter_sys=False)
        finally:
            sys.argv = argv
        return set(re.findall(r"(?<![\w-])--[a-z][\w-]*", out.getvalue()))

    known: dict[tuple[str, ...], set[str]] = {}
    bad, checked = [], 0
    for doc in (d for d in DOCS if d.name != "benchmarks-history.md"):
        for span in _code_spans(doc.read_text(encoding="utf-8")):
            for module, rest in re.findall(
                r"\bpython -m (benchmarks[\w.]*)((?: [^|;&>#]*)?)", span
            ):
                words = rest.split()
                sub = tuple(words[:1]) if words and re.fullmatch(r"[a-z]+", words[0]) else ()
                key = (module, *sub)
                if key not in known:
                    known[key] = options_of(module, *sub)
                checked += 1
                bad += [
                    f"{doc.name}: `python -m {module} … {flag}`: no such option"
                    for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)
                    if flag not in known[key]
                ]
    assert checked > 20, checked
    assert not bad, bad


def test_every_benchmark_section_the_code_cites_exists():
    """`(docs/benchmarks-history.md, "Issue 26, wave 14")` in a comment or a document leads to a
    heading that starts so; a section renamed or moved to the other file left a citation that
    leads nowhere (one named "Ingest: the event loop's pauses", which no heading was)."""
    docs = {
        name: [
            re.sub(r"^#+ ", "", line).lower()
            for line in (ROOT / "docs" / name).read_text(encoding="utf-8").splitlines()
            if line.startswith("#")
        ]
        for name in ("benchmarks.md", "benchmarks-history.md")
    }
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.toml", "*.yaml", "Makefile", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    bad, cited = [], 0
    for name in tracked:
        if name.startswith("docs/benchmarks"):
            continue  # their own sections are linked, and checked above
        text = (ROOT / name).read_text(encoding="utf-8")
        for doc, title in re.findall(
            r"docs/(benchmarks(?:-history)?\.md)`*,?\s*(?:#\s*)?\(?\"([^\"]+)\"", text
        ):
            title = re.sub(r"\s*\n\s*(?:#\s*)?", " ", title).lower()
            cited += 1
            if not any(heading.startswith(title) for heading in docs[doc]):
                bad.append(f'{name}: {doc}, "{title}"')
    assert cited > 30, cited
    assert not bad, f"citations of no section: {bad}"


def test_the_settings_tables_give_each_settings_default():
    """docs/api.md's tables of `c.GpuGovernor.*` settings say each default as the trait has it
    (`dcgm_timeout` | `5`): a default changed in hub/settings.py left the table saying another.
    A default written as words (`$JUPYTERHUB_API_URL`, "from …") is the reader's, not checked."""
    import ast

    from jupyter_gpu_gov.hub.app import GpuGovernor

    traits = GpuGovernor.class_traits(config=True)
    api = _text("docs/api.md")
    bad, checked = [], 0
    for names, defaults in re.findall(r"^\| ((?:`[\w.]+`(?:, )?)+) \| ([^|]+) \|", api, re.M):
        names = [n.removeprefix("c.GpuGovernor.") for n in re.findall(r"`([\w.]+)`", names)]
        cell = re.sub(r"\([^)]*\)", "", defaults).strip()  # `67108864` (64 MiB)
        if not re.fullmatch(r"`[^`$]*`(?:, `[^`$]*`)*", cell) or not all(
            n in traits for n in names
        ):
            continue  # a meaning, or a default in words
        literals = re.findall(r"`([^`]*)`", cell)
        if len(literals) != len(names):
            continue
        for name, literal in zip(names, literals, strict=True):
            try:
                written = ast.literal_eval(literal)
            except (ValueError, SyntaxError):
                written = literal  # a bare string: `internal-ssl`
            checked += 1
            if written != traits[name].default():
                bad.append(f"{name}: `{literal}`, the trait's {traits[name].default()!r}")
    assert checked > 40, checked
    assert not bad, bad


def test_the_ranges_table_gives_every_number_setting_its_range():
    """docs/api.md's table of the number settings' ranges is every number setting of every
    layer (``tests/test_settings.py`` finds them), each with the range its trait refuses past."""
    from test_settings import _number_settings
    from traitlets import Int

    from jupyter_gpu_gov.core.traits import range_words

    section = _text("docs/api.md").split("### The number settings' ranges", 1)[1]
    written = set(re.findall(r"^\| `c\.(\w+\.\w+)` \| ([^|]+) \| ([^|]+) \|$", section, re.M))
    expected = {
        (
            f"{cls.__name__}.{name}",
            range_words(trait.low, trait.high, trait.above).removeprefix("from "),
            ("whole number" if isinstance(trait, Int) else "number")
            + (f" of {trait.unit}" if trait.unit else ""),
        )
        for cls, name, trait in _number_settings()
    }
    from test_settings import _number_dict_settings

    for cls, name, trait in _number_dict_settings():  # per tier or team: each entry's range
        kind = "whole number" if trait.whole else "number"
        of = f" of {trait.unit}" if trait.unit else ""
        ranged = range_words(trait.low, trait.high, trait.above).removeprefix("from ")
        expected.add((f"{cls.__name__}.{name}", ranged, f"{kind}{of}, per {trait.per}"))
        for part, (low, high, unit) in trait.parts.items():
            ranged = range_words(low, high).removeprefix("from ")
            what = f"whole number of {unit}, per {trait.per} (its `{part}`)"
            expected.add((f"{cls.__name__}.{name}", ranged, what))
    assert written == expected, (sorted(written - expected), sorted(expected - written))


def _series_labels() -> dict[str, set[str]]:
    """Each governor and server-extension series' labels (a histogram's ``le`` too), by its
    name and by the names of its samples (``_total``, ``_bucket``, ...)."""
    from prometheus_client import REGISTRY as SERVER_REGISTRY

    from jupyter_gpu_gov.hub import metrics
    from jupyter_gpu_gov.hub import queue as _queue  # noqa: F401  (registers its series)
    from jupyter_gpu_gov.server import metrics as _server  # noqa: F401  (likewise)

    found: dict[str, set[str]] = {}
    for registry in (metrics.REGISTRY, SERVER_REGISTRY):
        for collector, names in registry._collector_to_names.items():
            labels = set(getattr(collector, "_labelnames", getattr(collector, "LABELS", ())))
            if getattr(collector, "_type", "") == "histogram":
                labels.add("le")
            found.update((name, labels) for name in names if name.startswith("jupyter_gpu_gov_"))
    return found


def test_every_label_a_document_or_the_dashboard_reads_is_on_its_series():
    """A label the documents or the Grafana dashboard give a series (a table's Labels column,
    a selector ``{state="active"}`` or ``{team,tier}``, a ``by (team)`` over that series
    alone) is one the series carries: a panel grouping by a label that is not there draws one
    unlabelled line, and a selector on it matches nothing, with no error anywhere."""
    import json

    series = _series_labels()
    assert len(series) > 40 and series["jupyter_gpu_gov_culls_total"] == {"reason", "action"}
    dashboard = json.loads(_text("hub_config/grafana/jupyter-gpu-gov-dashboard.json"))
    sources = {
        "the dashboard": "\n".join(
            t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])
        )
    }
    sources.update((d.name, d.read_text(encoding="utf-8")) for d in DOCS)
    del sources["benchmarks-history.md"]  # a log of its day
    bad = []
    for where, text in sources.items():
        for name, selector in re.findall(r"\b(jupyter_gpu_gov_[a-z_]+)\{([^}]*)\}", text):
            keys = re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector) or selector.split(",")
            bad += [
                f"{where}: {name}{{{k.strip()}}}" for k in keys if k.strip() not in series[name]
            ]
        for by, inner in re.findall(r"\bby \(([^)]*)\) \(((?:[^()]|\([^()]*\))*)\)", text):
            names = set(re.findall(r"\bjupyter_gpu_gov_[a-z_]+", inner))
            if len(names) == 1 and not re.search(r"\b(DCGM_|kube_)", inner):
                (name,) = names
                keys = {k.strip() for k in by.split(",")}
                bad += [f"{where}: by ({k}) over {name}" for k in keys - series[name]]
        for name, cell in re.findall(r"^\| `(jupyter_gpu_gov_[a-z_]+)` \| ([^|]*) \|", text, re.M):
            if set(re.findall(r"`(\w+)`", cell)) != series[name] - {"le"}:
                bad.append(f"{where}: the table gives {name} {cell.strip()!r}")
    assert not bad, bad


def test_the_tokens_table_gives_the_scopes_add_governor_grants():
    """docs/security.md's table of tokens is what ``add_governor`` configures, scope for
    scope: the governor's token has no ``access:servers`` (it calls no user's server), a
    server's own token no admin scope, the dashboard's login at most the two it names. A scope
    added to one of them without the table is a credential no admin was told of."""
    from traitlets.config import Config

    from jupyter_gpu_gov.hub.hubconfig import add_governor

    WORDS = {"self", "servers", "admin-ui"}  # the scopes without a colon
    c = Config()
    add_governor(c, cull_users=True)
    roles = {r["name"]: set(r["scopes"]) for r in c.JupyterHub.load_roles.get_value([])}
    (service,) = c.JupyterHub.services.get_value([])
    given = {
        "the governor service's": roles["gpu-gov-service"],
        "a single-user server's own": set(c.Spawner.server_token_scopes),
        "a user's": roles["user"],
        "governor admins'": roles["gpu-gov-admins"],
        "the dashboard's OAuth client": set(service["oauth_client_allowed_scopes"]),
    }
    section = _text("docs/security.md").split("## The tokens and their scopes")[1]
    rows = re.findall(r"^\| ([^|(]+?)(?: \([^|]*\))? \| ([^|]*) \|", section, re.M)
    table = {  # the scopes of each row (not the settings it names, `cull_users`)
        who.strip(): {s for s in re.findall(r"`([^`]+)`", scopes) if ":" in s or s in WORDS}
        for who, scopes in rows
        if who.strip() in given
    }
    table["governor admins'"].add("access:services!service=gpu-gov")  # "(+ the access scope)"
    assert table == given
    assert "access:servers" not in given["the governor service's"]


def test_the_profile_layers_key_tables_name_every_key_it_takes():
    """docs/profiles.md's tables of a tier's and a quota's keys are the keys the profile layer
    accepts, no more and no fewer: a key missing there is one no admin can learn of (a
    tier's `resource` was), and one the code refuses stops the hub at start-up."""
    from jupyter_gpu_gov.profiles import quota, tiers

    text = _text("docs/profiles.md")

    def keys(section: str) -> set[str]:
        cells = re.findall(r"^\| ([^|]+) \|", section, re.M)
        return {k for cell in cells for k in re.findall(r"`(\w+)`", cell)}

    tier_table = text.split("## Tiers")[1].split("### The card catalogue")[0]
    quota_table = text.split("## Quotas")[1].split("Admission (")[0]
    assert keys(tier_table) == tiers._KEYS
    assert keys(quota_table) == quota._KEYS


def test_health_mds_xid_table_is_the_judges():
    """docs/health.md's table of faults gives the XIDs ``core/health.py`` judges a reset and
    a drain, each of them, and only application XIDs as the program's: an admin reads there
    which XID takes a card away from its owner."""
    from jupyter_gpu_gov.core import health

    table = _text("docs/health.md").split("## What is a fault")[1].split("The XIDs follow")[0]

    def xids(row_start: str) -> set[int]:
        (row,) = [r for r in table.splitlines() if r.startswith(f"| {row_start}")]
        cell = row.split("|")[1].split(";")[0]
        spans = re.findall(r"(\d+)(?:\u2013(\d+))?", cell)  # an en dash: 144-150
        return {x for a, b in spans for x in range(int(a), int(b or a) + 1)}

    judged = {
        need: {x for x, (_, a) in health.XIDS.items() if a == need} for need in health.ACTIONS
    }
    assert xids("XID 46") == judged[health.RESET]
    assert xids("XID 63") == judged[health.DRAIN]
    assert xids("an application's XID") <= health.APPLICATION_XIDS


def test_every_showback_column_is_named_and_explained_in_the_csvs_order():
    """A finance reader takes the CSV's header to docs/api.md: each column has its own row in
    the table of columns there (two of them, `gpu_hours_idle_held` and `_free`, were only
    hinted at as "`_idle_held`"), listed in the CSV's order."""
    from jupyter_gpu_gov.hub.showback import COLUMNS

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    table = api[api.index("| Column | Meaning |") :].split("\n\n")[0]
    named = re.findall(r"^\| ([^|]+) \|", table, re.M)[2:]  # past the header and its rule
    listed = [name for cell in named for name in re.findall(r"`(\w+)`", cell)]
    assert "period" in listed and [c for c in listed if c in COLUMNS] == list(COLUMNS)
    explained = re.findall(r"`(\w+)`", table)
    assert not [c for c in COLUMNS if c not in explained]
