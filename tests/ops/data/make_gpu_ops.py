"""Write mxnet_1.9.1_gpu_ops.txt: the MXNet operators with a GPU implementation in 1.9.1.

Read out of MXNet's source at tag 1.9.1: every ``NNVM_REGISTER_OP(name)`` statement in a
``.cu`` file that sets ``FCompute<gpu>``, ``FComputeEx<gpu>``, ``FStatefulCompute<gpu>`` or
``FStatefulComputeEx<gpu>``, and (legacy operators) every op registered with
``MXNET_REGISTER_OP_PROPERTY`` in a ``.cc`` file whose sibling ``.cu`` defines
``CreateOp<gpu>``.  Command (a clone of https://github.com/apache/mxnet with its tags):

    python tests/ops/data/make_gpu_ops.py /path/to/mxnet 1.9.1 \
        > tests/ops/data/mxnet_1.9.1_gpu_ops.txt
"""

import re
import subprocess
import sys

GPU = re.compile(r'"(FCompute|FComputeEx|FStatefulCompute|FStatefulComputeEx)<gpu>"')


def files(repo, tag, pattern):
    out = subprocess.run(
        ["git", "-C", repo, "ls-tree", "-r", "--name-only", tag],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [f for f in out if f.startswith("src/") and f.endswith(pattern)]


def show(repo, tag, path):
    return subprocess.run(
        ["git", "-C", repo, "show", f"{tag}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def main(repo, tag):
    names = set()
    for path in files(repo, tag, ".cu"):
        text = show(repo, tag, path)
        # each registration runs from NNVM_REGISTER_OP( to the next one (or the file's end)
        parts = re.split(r"NNVM_REGISTER_OP\(\s*([A-Za-z0-9_]+)\s*\)", text)
        for name, body in zip(parts[1::2], parts[2::2]):
            if GPU.search(body.split("NNVM_REGISTER_OP")[0]):
                names.add(name)
        if "CreateOp<gpu>" in text:
            try:
                cc = show(repo, tag, path[:-3] + ".cc")
            except subprocess.CalledProcessError:
                continue
            names.update(re.findall(r"MXNET_REGISTER_OP_PROPERTY\(\s*([A-Za-z0-9_]+)\s*,", cc))
    print(f"# MXNet {tag}: operators with a GPU implementation (tests/ops/data/make_gpu_ops.py)")
    for name in sorted(names):
        print(name)


if __name__ == "__main__":
    main(*sys.argv[1:3])
