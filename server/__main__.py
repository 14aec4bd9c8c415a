from andrea.cli import main

raise SystemExit(main())
