from torch_overlay._overlay.cli import main


raise SystemExit(main())
