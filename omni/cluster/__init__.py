"""Where stage processes run: this machine (`local`) or a Ray cluster (`ray_host`), the stage
process both start (`proc`), and how actors on several hosts find each other (`addresses`). The
kernel knows only the host interface."""
