"""A bytecode worker: compiles modules for `bytecode.HostCompiler`, in an interpreter of its own started as
`python -I -S pyc_worker.py NICE`, importing nothing but the standard library modules named here.

Why an interpreter of its own, started that way: marshal writes a string as a back-reference or not by
its reference count in the compiling process, and a module's names are interned strings shared with
every module that process has loaded, so the same source compiles to other .pyc bytes in a process that
imported other modules (measured: pydantic's and jinja2's in a worker that had imported this tool and
docker, against one that had not). Isolated (-I: no environment variables, user site or script
directory) and without site-packages (-S: no `.pth` file runs), the worker holds the same modules on
every host with the same Python, whatever is installed beside the tool, so a wheel's layer is the same
on a CI runner with a light install as on a developer's machine with torch and Ray. Each module is
compiled alone (its code object freed before the next), so its bytes do not depend on the batch either.

Protocol, on stdin and stdout: each message an 8-byte big-endian length and a marshal'd value. A request
is (wheel path, [(member, tar name)]) or (None, [(tar name, source bytes)]); the answer {tar name: .pyc
bytes, or None for a source that does not compile}, or ("error", text).
"""
import importlib.util
import marshal
import os
import struct
import sys
import warnings
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc


def pyc(name, source):
    """The unchecked-hash .pyc of SOURCE, compiled as `compileall` would with /NAME as its file name
    (the path in the image: tracebacks name it); None for a source that does not compile (Python 2
    fixtures, null bytes: compiled at import, if ever imported)."""
    try:
        code = compile(source, "/" + name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False))


def answer(request):
    wheel, items = request
    if wheel is None:
        return {name: pyc(name, source) for name, source in items}
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for member, name in items:
            out[name] = pyc(name, z.read(member))
    return out


def main():
    os.nice(int(sys.argv[1]))
    warnings.simplefilter("ignore")  # a package's invalid escape sequences: compileall -q says nothing either
    read, write = sys.stdin.buffer.read, sys.stdout.buffer
    while True:
        head = read(8)
        if len(head) < 8:
            return
        try:
            result = answer(marshal.loads(read(struct.unpack(">Q", head)[0])))
        except Exception as e:  # a wheel gone or damaged: the build names it
            result = ("error", f"{type(e).__name__}: {e}")
        data = marshal.dumps(result)
        write.write(struct.pack(">Q", len(data)) + data)
        write.flush()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the build says what stopped
        sys.exit(130)
