"""The command line, `andrea serve | train | export`: what a user runs in a terminal, apart
from the server it talks to.

  main.py            the parser and the serve command (the `andrea` entry point)
  train_args.py      `andrea train`'s options, from RunConfig's fields
  headless.py        `andrea train`: a run made or resumed, trained in a headless browser
  chromium.py        that browser: finding it, its flags, the training page's state
  train_output.py    what `andrea train` prints (progress, spikes, --json)
  bad_settings.py    a bad flag, ANDREA_* variable or --room option said in one line (exit 2)
  http_client.py     the one HTTP client of `andrea train` and `andrea export --server`
  launch.py          a server started for a command (and for the tests and benchmarks)
  export_command.py  `andrea export`
"""
