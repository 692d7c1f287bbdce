from gpusched.entry import main

raise SystemExit(main())
