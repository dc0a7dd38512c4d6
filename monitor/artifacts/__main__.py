from monitor.artifacts.command import main

raise SystemExit(main())
