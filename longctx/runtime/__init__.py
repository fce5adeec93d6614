"""How a longctx process runs: its first statements (startup.py), its rank from the launcher's
environment (launch_env.py), death with its launcher (launcher_tie.py), other ranks' third-party
warnings quieted (third_party_logs.py) and the stall watch that ends a stalled job (watchdog.py).
All but the stall watch are stdlib only, so the command line loads them before anything slow."""
