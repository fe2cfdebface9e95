#!/bin/bash
echo A > /app/answer.txt
