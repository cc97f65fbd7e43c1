from __future__ import annotations

from dsv4patch.main import main

raise SystemExit(main())
