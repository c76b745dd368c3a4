def main() -> None:
    raise NotImplementedError
