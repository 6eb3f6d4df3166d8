from specpilot.cli import main

raise SystemExit(main())
