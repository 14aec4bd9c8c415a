"""The server's operations as the domain does them, composed from the packages below (the
store, the runs' files and sweep, the room, the data, the budgets): plain async functions that
take what they use and raise errors.Refused. The routes parse a request, call one, and shape
the answer; web/errors.py maps what they refuse.

  runs.py     create (a plain run, a room run, a branch of a checkpoint), update, delete,
              resume
  rooms.py    a room run's join, leave, removal, pseudo-gradients, reports, progress and
              reads
  exports.py  a run's metrics as JSON or CSV pages, its weights as safetensors, its
              checkpoint's files and their zip, made on a thread as it is read
"""
