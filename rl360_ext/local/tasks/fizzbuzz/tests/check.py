import subprocess

out = subprocess.run(
    ["python3", "/app/fizzbuzz.py", "16"], capture_output=True, text=True, timeout=10
).stdout.split()
expected = [
    "FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)
    for i in range(1, 17)
]
assert out == expected, out
