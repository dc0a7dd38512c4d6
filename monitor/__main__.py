from monitor.cli.main import main

raise SystemExit(main())
