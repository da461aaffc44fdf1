"""Message and storage models shared by the coordinator, the workers and the simulator."""
