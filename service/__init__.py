"""The control plane: settings, store, queue, planner, dispatcher, scheduler, analysis and the CLI."""
