"""The control plane: settings, store, queue, planner, dispatcher, pools, scheduler and the analysis."""
