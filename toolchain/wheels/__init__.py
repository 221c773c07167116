"""The project's wheels: its requirements read (requirements), resolved (resolver, with uv), fetched
into the user's pool (wheelhouse) and checked before any layer is made of them (wheel_checks)."""
