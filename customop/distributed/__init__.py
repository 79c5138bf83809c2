"""Training past one device: the local job launcher and keeping auxiliary states in agreement.

``python -m customop.distributed.launch -n 2 -s 1 python train.py`` starts a
``dist_sync`` job on 127.0.0.1 and ends all of it when any worker fails;
:class:`~customop.distributed.auxsync.AuxSync` sums the updates of operators'
auxiliary states over devices and workers (``dist_sync``'s or Horovod's).
"""
