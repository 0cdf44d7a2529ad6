"""One engine step between the scheduler's plan and the output: its phases and the talker stage."""
