"""What several test modules share: scripted agents and runs, proxies, tasks, red-team
forgeries. Test modules import from here, never from one another or from a conftest."""
