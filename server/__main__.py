from andrea.cli.main import main

raise SystemExit(main())
