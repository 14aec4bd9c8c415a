"""A run's life, in one place: the statuses and what the API shows of a run (info.py), the
changes around its trainer, its watchdogs and telling its viewers (lifecycle.py), and the app's
sweep of runs apart from requests (sweep.py). The routes and the sockets call these; nothing
here is HTTP's or a socket's.

  info.py       RunStatus, ENDED, EXPLAINED, RESUMABLE; public_run (a run as the API shows it)
  lifecycle.py  publish_run, the no-trainer lock (RunBusy), the interrupted-run watchdogs
  sweep.py      never-started runs become `abandoned`; half-copied branches are removed
"""
