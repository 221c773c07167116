"""A user's project: its settings found from the current directory, its requirements as the user keeps
them, and `raytrain init` (toolchain/project.py, toolchain/wheels/requirements.py, toolchain/scaffold.py).
Engine-free: the build of such a project is tests/test_packaging.py's."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolchain import project
from toolchain.wheels import requirements
from toolchain.errors import ConfigError
from toolchain.boundary import ConfigFileError

RAYTRAIN = str(Path(sys.executable).parent / "raytrain")
TABULATE_SHA = "0095b12bf5966de529c0feb1fa08671671b3368eec77d7ef7ab114be2c068b3c"


def raytrain(*args, cwd, env=None):
    return subprocess.run([RAYTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- where the settings are -------------------------------------------------------------
def test_the_nearest_project_wins_and_paths_are_its_own(tmp_path):
    outer, inner = tmp_path / "outer", tmp_path / "outer" / "pkg" / "inner"
    inner.mkdir(parents=True)
    (outer / "raytrain.yaml").write_text("project:\n  app_dir: src\n")
    (inner / "pyproject.toml").write_text('[project]\nname = "Inner.Proj_x"\n[tool.raytrain.deploy]\nnodes = 2\n')
    deep = inner / "a" / "b"
    deep.mkdir(parents=True)
    found = project.locate(deep)
    assert found.root == inner and found.file == inner / "pyproject.toml" and found.settings == {"deploy": {"nodes": 2}}
    assert found.name() == "inner-proj-x"  # [project] name, PEP 503-normalised
    mid = project.locate(outer / "pkg")
    assert mid.root == outer and mid.settings == {"project": {"app_dir": "src"}} and mid.name() == "outer"
    s = project.settings(deep)
    assert s.root == inner and s.deploy.nodes == 2 and s.deploy.name == "inner-proj-x"
    assert s.build_dir == inner / "build" and s.path(s.project.spec) == inner / "cluster_specs" / "local.json"
    assert not project.locate(tmp_path).found


def test_a_pyproject_without_the_table_is_not_a_raytrain_project(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert not project.locate(tmp_path).found


@pytest.mark.parametrize("yaml_text,table,ok", [
    ("deploy:\n  nodes: 2\n", "[tool.raytrain.deploy]\nnodes = 2\n", True),   # the same: fine
    ("deploy:\n  nodes: 2\n", "", True),                                         # only the yaml
    ("deploy:\n  nodes: 2\n", "[tool.raytrain.deploy]\nnodes = 4\n", False),   # they disagree
])
def test_both_files_must_agree(tmp_path, yaml_text, table, ok):
    (tmp_path / "raytrain.yaml").write_text(yaml_text)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n' + table)
    if ok:
        assert project.locate(tmp_path).settings == {"deploy": {"nodes": 2}}
    else:
        with pytest.raises(ConfigFileError, match=r"raytrain.yaml and \[tool.raytrain\] in .*pyproject.toml both hold "
                                                  r"settings, and they differ; keep one"):
            project.locate(tmp_path)


@pytest.mark.parametrize("raw,ok", [("My_Project.v2", "my-project-v2"), ("a", "a"), ("9lives", None),
                                    ("x" * 41, None), ("café", None), ("-", None), ("ok--name", "ok-name")])
def test_a_project_name_that_cannot_name_images_is_refused(raw, ok):
    if ok:
        assert project.image_name(raw, "here") == ok
    else:
        with pytest.raises(ConfigError, match="here: the project's name .* cannot name its images and jobs.*project.name"):
            project.image_name(raw, "here")


def test_outside_a_project_the_cli_says_how_to_make_one(tmp_path):
    r = raytrain("build", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"no raytrain project in {tmp_path} or above it" in r.stderr and "raytrain init" in r.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "pyproject.toml").write_text("[project\nname=")
    r = raytrain("build", cwd=bad)
    assert r.returncode == 2 and "pyproject.toml: not valid TOML" in r.stderr and "Traceback" not in r.stderr


def test_settings_come_from_the_project_file_and_variables_and_flags_override(tmp_path):
    (tmp_path / "raytrain.yaml").write_text("deploy:\n  nodes: 2\n  name: fromfile\n")
    (tmp_path / "cluster_specs").mkdir()
    (tmp_path / "cluster_specs" / "local.json").write_text(
        (Path(__file__).resolve().parents[1] / "cluster_specs" / "local.json").read_text())
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "images.json").write_text(json.dumps({"cpu": {
        "local_ref": "x-cpu:1", "image_id": "sha256:" + "1" * 64, "repo_digest": "127.0.0.1:5000/x-cpu@sha256:" + "2" * 64,
        "digest": "sha256:" + "2" * 64, "spec_sha256": json.loads(raytrain(
            "spec.check", "cluster_specs/local.json", "--json", cwd=tmp_path).stdout)["sha256"],
        "registry": "127.0.0.1:5000", "registry_scheme": "http"}}))
    job = lambda *a, **env: json.loads(raytrain("deploy", "--dry-run", "--json", *a, cwd=tmp_path, env=env).stdout)["job"]
    assert (job()["nodes"], job()["name"]) == (2, "fromfile")
    assert job(INVOKE_DEPLOY_NODES="3")["nodes"] == 3
    assert job("--nodes", "1", INVOKE_DEPLOY_NODES="3")["nodes"] == 1


# -- requirements as the user keeps them ---------------------------------------------------
def test_a_pip_tools_file_with_hashes_continuations_comments_and_markers(tmp_path):
    text = ("# pip-compile --generate-hashes\n"
            "tabulate==0.9.0 \\\n"
            f"    --hash=sha256:{TABULATE_SHA} \\\n"
            f"    --hash=sha256:{'ab' * 32}\n"
            "    # via my-project\n"
            "pywin32==306 ; sys_platform == 'win32'\n"
            "typing-extensions==4.12.2 ; python_version < '3.13'  # inline comment\n")
    (tmp_path / "requirements.txt").write_text(text)
    got = requirements.read(tmp_path / "requirements.txt", "requirements.txt")
    assert [r.name for r in got] == ["tabulate", "pywin32", "typing-extensions"]
    assert got[0].hashes == {TABULATE_SHA, "ab" * 32} and got[0].source == "requirements.txt:2"
    assert [r.name for r in requirements.for_image(got, "3.11")] == ["tabulate", "typing-extensions"]
    assert [r.name for r in requirements.for_image(got, "3.13")] == ["tabulate"]


@pytest.mark.parametrize("line,says", [
    ("-e .", "requirements.txt:1: the pip option -e is not taken here"),
    ("--index-url https://x/simple", "the pip option --index-url is not taken here"),
    ("-r other.txt", "the pip option -r"),
    ("tabulate==0.9.0 --hash=md5:abc", "a --hash that is not sha256"),
    ("tabulate===", "requirements.txt:1: 'tabulate===' is not a requirement"),
    ("pkg @ https://example.com/pkg.whl", "names a URL"),
])
def test_a_requirement_file_that_does_not_parse_names_the_line(tmp_path, line, says):
    (tmp_path / "requirements.txt").write_text(line + "\n")
    with pytest.raises(ConfigError, match=__import__("re").escape(says)):
        requirements.read(tmp_path / "requirements.txt", "requirements.txt")


def test_pyproject_dependencies_and_a_pylock(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["tabulate>=0.9", "ray[train]"]\n')
    got = requirements.read(tmp_path / "pyproject.toml", "pyproject.toml")
    assert [r.text for r in got] == ["tabulate>=0.9", "ray[train]"]
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndynamic = ["dependencies"]\n')
    with pytest.raises(ConfigError, match="dependencies are dynamic"):
        requirements.read(tmp_path / "pyproject.toml", "pyproject.toml")
    (tmp_path / "pylock.toml").write_text(
        'lock-version = "1.0"\ncreated-by = "test"\n'
        '[[packages]]\nname = "tabulate"\nversion = "0.9.0"\n'
        f'[[packages.wheels]]\nname = "tabulate-0.9.0-py3-none-any.whl"\nhashes = {{sha256 = "{TABULATE_SHA}"}}\n'
        '[[packages]]\nname = "colorama"\nversion = "0.4.6"\nmarker = "sys_platform == \'win32\'"\n'
        '[[packages]]\nname = "me"\ndirectory = {path = "."}\n')
    lock = requirements.read(tmp_path / "pylock.toml", "pylock.toml")
    assert [(r.text, sorted(r.hashes)) for r in lock] == [
        ("tabulate==0.9.0", [TABULATE_SHA]), ('colorama==0.4.6; sys_platform == "win32"', [])]
    assert [r.name for r in requirements.for_image(lock, "3.11")] == ["tabulate"]


def test_a_uv_lock_is_read_through_uv_export(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "uvp"\nversion = "0.1"\nrequires-python = ">=3.11"\n'
                                             'dependencies = ["tabulate==0.9.0"]\n[dependency-groups]\ndev = ["six"]\n')
    subprocess.run([requirements.uv_binary(), "lock", "--project", str(tmp_path)], check=True, capture_output=True,
                   timeout=120)
    got = requirements.read(tmp_path / "uv.lock", "uv.lock")
    assert [r.name for r in got] == ["tabulate"] and TABULATE_SHA in got[0].hashes  # no dev group, no project
    (tmp_path / "uv.lock").write_text("version = 1\n[[package]\n")
    with pytest.raises(ConfigError, match="uv.lock: uv could not export it"):
        requirements.read(tmp_path / "uv.lock", "uv.lock")


def test_the_runtime_s_requirements_come_first_and_a_conflict_names_both():
    runtime = requirements.read(Path(__file__).resolve().parents[1] / "runtime" / "requirements.txt", "runtime")
    torch = requirements.parse_line("torch==2.9.1", "image.torch.cpu")
    user = [requirements.parse_line("ray[train]==2.60.0", "req:1"), requirements.parse_line("torch>=2.1", "req:2"),
            requirements.parse_line("nvidia-cublas-cu12==12.1.3.1", "req:3"), requirements.parse_line("numpy==2.2.0", "req:4")]
    got = [r.text for r in requirements.combine(runtime, user, torch)]
    assert got[: len(runtime)] == [r.text for r in runtime] and got[-1] == "torch==2.9.1"
    assert "ray[train]==2.60.0" in got and "numpy==2.2.0" in got and "torch>=2.1" not in got
    assert not any("cublas" in t for t in got)  # the variant's torch brings its own CUDA libraries
    with pytest.raises(ConfigError, match=r"the runtime needs ray==2.60.0 \(runtime:\d+\) and req:9 asks for ray==2.9.0"):
        requirements.combine(runtime, [requirements.parse_line("ray==2.9.0", "req:9")], torch)
    with pytest.raises(ConfigError, match=r"the runtime needs numpy>=1.24 .* and req:9 asks for numpy==1.23.5"):
        requirements.combine(runtime, [requirements.parse_line("numpy==1.23.5", "req:9")], torch)
    with pytest.raises(ConfigError, match=r"req:9 asks for torch<2, but this image variant's torch is torch==2.9.1"):
        requirements.combine(runtime, [requirements.parse_line("torch<2", "req:9")], torch)


# -- raytrain init --------------------------------------------------------------------------
def test_init_appends_its_tables_to_pyproject_and_leaves_the_rest_byte_for_byte(tmp_path):
    original = '[project]\nname = "My_Proj"\ndependencies = ["tabulate>=0.9"]\n\n[tool.black]\nline-length = 100'
    (tmp_path / "pyproject.toml").write_text(original)
    (tmp_path / "main.py").write_text("print(1)\n")
    r = raytrain("init", "--entry", "main.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith(original + "\n") and "[tool.raytrain.project]" in text
    s = project.settings(tmp_path)
    assert s.project.name == "my-proj" and s.project.requirements == ["pyproject.toml"] and s.project.app_dir == "."
    assert s.deploy.command == ["python", "main.py"] and s.deploy.name == "my-proj"
    spec = json.loads((tmp_path / "cluster_specs" / "local.json").read_text())
    assert (spec["cpu_image"], spec["gpu_image"], spec["cluster_name"]) == ("my-proj-cpu", "my-proj-gpu", "my-proj")
    before = tree(tmp_path)
    again = raytrain("init", "--entry", "main.py", cwd=tmp_path)
    assert again.returncode == 2 and "already holds raytrain settings; init overwrites nothing" in again.stderr
    assert "[tool.raytrain.project]" in again.stderr and tree(tmp_path) == before


def test_init_takes_the_lock_and_writes_raytrain_yaml_without_a_pyproject(tmp_path):
    d = tmp_path / "My_Repo"
    d.mkdir()
    (d / "requirements.txt").write_text(f"tabulate==0.9.0 --hash=sha256:{TABULATE_SHA}\n")
    (d / "pylock.toml").write_text('lock-version = "1.0"\n[[packages]]\nname = "tabulate"\nversion = "0.9.0"\n')
    (d / "train.py").write_text("print(1)\n")
    r = raytrain("init", cwd=d)
    assert r.returncode == 0, r.stderr
    s = project.settings(d)
    assert s.project.requirements == ["pylock.toml"] and s.deploy.command == ["python", "train.py"]
    assert s.project.name == "my-repo" and "name: my-repo" in (d / "raytrain.yaml").read_text()  # a directory's name
    # is written down: a checkout under another name keeps its images


@pytest.mark.parametrize("files,args,says", [
    ({}, [], "is not a Python project"),
    ({"requirements.txt": "-e .\n", "train.py": ""}, [], "requirements.txt:1: the pip option -e"),
    ({"requirements.txt": "tabulate\n"}, [], "--entry: which script starts the training"),
    ({"requirements.txt": "tabulate\n"}, ["--entry", "nope.py"], "is not a file in"),
    ({"requirements.txt": "tabulate\n"}, ["--entry", "../x.py"], "must be a path inside the project"),
    ({"requirements.txt": "", "train.py": ""}, ["--name", "9x"], "cannot name its images and jobs"),
    ({"requirements.txt": "", "train.py": ""}, ["--entry", "train.py", "--command", "python x.py"], "give one"),
])
def test_init_refuses_and_writes_nothing(tmp_path, files, args, says):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    before = tree(tmp_path)
    r = raytrain("init", *args, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert tree(tmp_path) == before


def test_init_example_needs_an_empty_directory_and_its_dry_run_writes_nothing(tmp_path):
    d = tmp_path / "demo"
    d.mkdir()
    dry = raytrain("init", "--example", "--dry-run", cwd=d)
    assert dry.returncode == 0 and "--- " in dry.stdout and os.listdir(d) == []
    assert raytrain("init", "--example", cwd=d).returncode == 0
    assert sorted(os.listdir(d)) == ["cluster_specs", "raytrain.yaml", "requirements.txt", "train.py"]
    s = project.settings(d)
    assert s.project.name == "demo" and s.deploy.name == "demo"
    again = raytrain("init", "--example", cwd=d)
    assert again.returncode == 2 and "is not empty" in again.stderr


def test_in_a_git_work_tree_the_code_is_what_git_lists(tmp_path):
    """A repository's data, outputs and checkpoints (.gitignore'd) stay out of the app layer; the same files
    outside git give the same tree hash (the same layer key)."""
    import shutil

    from toolchain.hashing import iter_tree, tree_hash
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "data").mkdir()
    (repo / ".gitignore").write_text("data/\n*.ckpt\n")
    (repo / "train.py").write_text("print(1)\n")
    (repo / "pkg" / "model.py").write_text("X = 1\n")
    (repo / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (repo / "last.ckpt").write_bytes(b"\0" * 100)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "train.py", ".gitignore"], check=True)
    (repo / "new.py").write_text("untracked, not ignored\n")
    listed = [p.relative_to(repo).as_posix() for p in iter_tree(repo)]
    assert listed == [".gitignore", "new.py", "train.py", "pkg/model.py"]
    plain = tmp_path / "plain"
    plain.mkdir()
    for rel in listed:
        (plain / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / rel, plain / rel)
    assert tree_hash(plain) == tree_hash(repo)
    assert [p.relative_to(plain).as_posix() for p in iter_tree(plain)] == listed


def test_a_directory_git_ignores_whole_is_every_file_it_holds(tmp_path):
    """The runtime installed into a venv inside the user's repository (.venv ignored) is still copied whole."""
    from toolchain.hashing import iter_tree
    repo = tmp_path / "repo"
    site = repo / "venvdir" / "runtime"
    site.mkdir(parents=True)
    (repo / ".gitignore").write_text("venvdir/\n")
    (site / "__init__.py").write_text("")
    (site / "requirements.txt").write_text("ray\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert [p.name for p in iter_tree(site)] == ["__init__.py", "requirements.txt"]
