#!/bin/bash
echo D > /app/answer.txt
