from tokpack.evaluation import main

raise SystemExit(main())
