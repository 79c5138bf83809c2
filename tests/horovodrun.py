"""``horovodrun``, with its servers listening on 127.0.0.1 only: the tests' Horovod jobs.

``horovodrun --gloo -np 2 -H localhost:2 --network-interface lo`` keeps Gloo's traffic on
the loopback (measured with ``ss``: every connection between the ranks is 127.0.0.1), but
its rendezvous server, which the ranks ask for each other's addresses, listens on every
interface (``horovod.runner.util.network.find_port`` binds ``('', port)``; 0.28.1).  This
runs horovodrun's own command line with that server bound to 127.0.0.1::

    python tests/horovodrun.py --gloo -np 2 -H localhost:2 --network-interface lo \\
        python worker.py ...
"""

import sys

from horovod.runner.http import http_server
from horovod.runner.launch import run_commandline

_find_port = http_server.find_port


def _loopback_port(server_factory):
    return _find_port(lambda addr: server_factory(("127.0.0.1", addr[1])))


if __name__ == "__main__":
    http_server.find_port = _loopback_port
    sys.argv[0] = "horovodrun"
    sys.exit(run_commandline())
