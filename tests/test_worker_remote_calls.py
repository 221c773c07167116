"""Remote calls in the worker half (runtime/workers, runtime/nemo_rl) pass their flags and settings by
keyword: `h.setup.remote(cls, env, backend=None, ...)`, not `h.setup.remote(cls, env, args, kw, None, 120,
None)`, where a flag's meaning hangs on its position in another module's signature."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_POSITIONAL = 2  # what a call names first (a method, a label, a class) and the one datum it is about


def positional_problems(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remote"):
            continue
        plain = [a for a in node.args if not isinstance(a, ast.Starred)]  # *args: the user's own, passed on
        where = f"{path.relative_to(ROOT)}:{node.lineno}"
        if len(plain) > MAX_POSITIONAL:
            out.append(f"{where}: {len(plain)} positional arguments")
        out += [f"{where}: positional constant {ast.unparse(a)}" for a in plain
                if isinstance(a, ast.Constant) and (a.value is None or isinstance(a.value, (bool, int, float)))]
        out += [f"{where}: positional *{ast.unparse(a.value)} of our own"
                for a in node.args if isinstance(a, ast.Starred) and isinstance(a.value, ast.Subscript)]
    return out


def test_remote_calls_pass_flags_by_keyword():
    files = sorted((ROOT / "runtime" / "workers").rglob("*.py")) + sorted((ROOT / "runtime" / "nemo_rl").glob("*.py"))
    assert len(files) > 10
    assert [p for f in files for p in positional_problems(f)] == []
