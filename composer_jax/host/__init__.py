"""What a program asks of the machine, with no JAX: its child processes (`processes`), the files
it creates (`files`) and the environment it starts in (`environment`). The lowest layer, so the
JAX-free coding-task tools, the trainer and the launchers share one copy of each."""
