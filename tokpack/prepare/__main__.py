from tokpack.preparation import main

raise SystemExit(main())
