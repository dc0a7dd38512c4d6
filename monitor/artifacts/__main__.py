from monitor.artifacts.generate import main

raise SystemExit(main())
